// Which work a backward CTA owns and which query tiles it visits. The grid is one CTA per (key block, kv head,
// batch), key blocks fastest (the CTAs running together read the same Q/dO from L2): from the first up in the
// default mode, so with a causal mask the longest walks start first and the grid's tail is short ones; from the
// last down in deterministic mode (dq_turn_of). A CTA walks every query head of its kv head's group and, for
// each, the query tiles [begin, end) that see at least one of its keys.
#pragma once

#include <cstdint>

#include "cuda/sm90/bwd/params.hpp"

namespace fa4::sm90 {

struct BwdWork {
  int32_t n_block, kv_head, batch;
  int32_t m_begin = 0, m_end = 0;  // query tiles that see a key of the block; empty: dK = dV = 0
  __device__ __forceinline__ bool empty() const { return m_end <= m_begin; }
};

// The query rows [first, last] that see at least one key of key block n_block (first > last: none). Row i sees
// a key of [key0, key_last] iff key_end(i) > key0 and key_begin(i) <= key_last; both ends grow with i, so the
// rows form one interval.
struct RowInterval {
  int64_t first, last;
};
template <int BlockN>
__device__ __forceinline__ RowInterval rows_seeing_key_block(const BwdParams& p, int32_t n_block) {
  const int64_t key0 = int64_t(n_block) * BlockN;
  const int64_t key_last = (key0 + BlockN < p.seqlen_k ? key0 + BlockN : int64_t(p.seqlen_k)) - 1;
  const num::Mask& m = p.mask;
  RowInterval r{0, int64_t(p.seqlen_q) - 1};
  if (m.right >= 0 && key0 - m.offset() - m.right > r.first) r.first = key0 - m.offset() - m.right;
  if (m.left >= 0 && key_last - m.offset() + m.left < r.last) r.last = key_last - m.offset() + m.left;
  if (key_last < key0) r.last = r.first - 1;
  return r;
}

template <int BlockM, int BlockN>
__device__ __forceinline__ bool key_block_sees_query_tile(const BwdParams& p, int32_t n_block, int32_t m_block) {
  const RowInterval r = rows_seeing_key_block<BlockN>(p, n_block);
  return r.first <= r.last && r.first / BlockM <= m_block && m_block <= r.last / BlockM;
}

template <int BlockM, int BlockN>
__device__ __forceinline__ BwdWork bwd_work(const BwdParams& p) {
  BwdWork w;
  const int32_t linear = int32_t(blockIdx.x);
  const int32_t slot = linear % p.n_block_slots;
  w.n_block = p.deterministic ? p.n_block_slots - 1 - slot : slot;  // deterministic: the last first, see dq_turn_of
  w.kv_head = (linear / p.n_block_slots) % p.heads_kv;
  w.batch = linear / p.n_block_slots / p.heads_kv;
  RowInterval r = rows_seeing_key_block<BlockN>(p, w.n_block);
  if (p.cluster_pair) {
    // A pair (blocks 2j, 2j + 1: consecutive CTAs, n_block_slots even) walks the union of its two ranges, so both
    // CTAs take every step of the shared Q/dO stages and dQ exchange; a tile a block does not see is all masked
    // (P = dS = 0: its dQ half is zeros, dK and dV are unchanged).
    const RowInterval peer = rows_seeing_key_block<BlockN>(p, w.n_block ^ 1);
    if (r.first > r.last) {
      r = peer;
    } else if (peer.first <= peer.last) {
      r.first = peer.first < r.first ? peer.first : r.first;
      r.last = peer.last > r.last ? peer.last : r.last;
    }
  }
  if (r.first <= r.last) {
    w.m_begin = int32_t(r.first / BlockM);
    w.m_end = int32_t(r.last / BlockM + 1);
  }
  return w;
}

// Deterministic mode: the key blocks that visit a query tile are consecutive (the row intervals move
// monotonically with the key block), and they add their dQ slabs from the last of them down: a block's turn on
// the tile is its distance from the last visitor. With causal masks the last visitor of a tile is the block on
// its diagonal, whose walk starts there, so every CTA's first tile needs no wait and the chains advance together
// (in ascending order, CTA n's first tile would wait for block 0 to walk down to it). Blocks are launched from the
// last down (bwd_work), so a CTA waits only for CTAs launched before it: no CTA waits for one not yet resident.
template <int BlockM, int BlockN>
__device__ __forceinline__ int32_t dq_turn_of(const BwdParams& p, int32_t n_block, int32_t m_block) {
  const num::Mask& m = p.mask;
  if (m.left < 0) {
    // No left window: every block up to the last one that row_last sees visits the tile.
    if (m.right < 0) return p.n_blocks - 1 - n_block;
    const int64_t row_last = (int64_t(m_block + 1) * BlockM < p.seqlen_q ? int64_t(m_block + 1) * BlockM
                                                                         : int64_t(p.seqlen_q)) - 1;
    const int64_t last_key = row_last + m.offset() + m.right;  // the last key row_last sees, if below seqlen_k
    const int64_t last = last_key / BlockN < p.n_blocks - 1 ? last_key / BlockN : int64_t(p.n_blocks) - 1;
    return int32_t(last) - n_block;
  }
  // With a left window the visitors are at most window / block_n + 2 blocks: a short walk forward.
  int32_t last = n_block;
  while (last + 1 < p.n_blocks && key_block_sees_query_tile<BlockM, BlockN>(p, last + 1, m_block)) ++last;
  return last - n_block;
}

}  // namespace fa4::sm90
