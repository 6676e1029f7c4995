// Which work a backward CTA owns and which query tiles it visits. A work item is one (key block, kv head, batch),
// key blocks fastest (the CTAs running together read the same Q/dO from L2), and the grid one CTA per item, or
// fewer CTAs looping over the items (a persistent grid): from the first key block up in the default mode, so with
// a causal mask the longest walks start first and the grid's tail is short ones; from the last down in
// deterministic mode (dq_turn_of). A CTA walks every query head of its kv head's group and, for each, the query
// tiles [begin, end) that see at least one of its keys.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/bwd/params.hpp"
#include "cuda/sm90/bwd/walk_order.hpp"
#include "cuda/sm90/seq_geometry.hpp"

namespace fa4::sm90 {

// A CTA of a dense batch: the problem's sizes and mask, read from the parameters where they are used (constant
// bank operands: no register held for them). The roles take the work as a template (`const Work&`), so a
// variable-length CTA (BwdVarlenWork) answers the same questions with its sequence's values.
struct BwdWork {
  static constexpr bool kVarlen = false;
  int32_t n_block, kv_head, batch;
  int32_t m_begin = 0, m_end = 0;  // query tiles that see a key of the block; empty: dK = dV = 0
  __device__ __forceinline__ bool empty() const { return m_end <= m_begin; }
  __device__ __forceinline__ const num::Mask& mask(const BwdParams& p) const { return p.mask; }
  __device__ __forceinline__ int32_t seqlen_q(const BwdParams& p) const { return p.seqlen_q; }
  __device__ __forceinline__ int32_t seqlen_k(const BwdParams& p) const { return p.seqlen_k; }
  __device__ __forceinline__ int32_t n_blocks(const BwdParams& p) const { return p.n_blocks; }
  // The tensors' coordinates of the sequence's first query and key rows, and of its batch.
  __device__ __forceinline__ int32_t q_row0() const { return 0; }
  __device__ __forceinline__ int32_t k_row0() const { return 0; }
  __device__ __forceinline__ int32_t tensor_batch() const { return batch; }
  // The workspace row of query head h's row 0: bwd_ws_row_base's dense case, written out so the dense kernels
  // carry no test of rows_total (through the shared function ptxas spilled 8-16 B more at d = 256 and 192).
  template <int BlockM>
  __device__ __forceinline__ int64_t ws_row_base(const BwdParams& p, int32_t h) const {
    return (int64_t(batch) * p.heads_q + h) * p.ws.rows_padded;
  }
};

// A CTA of a variable-length batch: `batch` is its sequence, whose rows start at geo's offsets in the packed
// tensors (mapped and addressed as batch 1); its workspace rows are at base(batch) of each head's compact region
// (or its own padded rows where that layout is the smaller: bwd_ws_row_base).
struct BwdVarlenWork : BwdWork {
  static constexpr bool kVarlen = true;
  SeqGeometry geo;
  int32_t seq_n_blocks = 0;  // the sequence's key blocks (key blocks from there on are empty CTAs)
  __device__ __forceinline__ const num::Mask& mask(const BwdParams&) const { return geo.mask; }
  __device__ __forceinline__ int32_t seqlen_q(const BwdParams&) const { return geo.seqlen_q; }
  __device__ __forceinline__ int32_t seqlen_k(const BwdParams&) const { return geo.seqlen_k; }
  __device__ __forceinline__ int32_t n_blocks(const BwdParams&) const { return seq_n_blocks; }
  __device__ __forceinline__ int32_t q_row0() const { return geo.q_row0; }
  __device__ __forceinline__ int32_t k_row0() const { return geo.k_row0; }
  __device__ __forceinline__ int32_t tensor_batch() const { return 0; }
  template <int BlockM>
  __device__ __forceinline__ int64_t ws_row_base(const BwdParams& p, int32_t h) const {
    return bwd_ws_row_base(p.ws, batch, h, p.heads_q, geo.q_row0, BlockM);
  }
};

// The query rows [first, last] that see at least one key of key block n_block (first > last: none). Row i sees
// a key of [key0, key_last] iff key_end(i) > key0 and key_begin(i) <= key_last; both ends grow with i, so the
// rows form one interval.
struct RowInterval {
  int64_t first, last;
};
template <int BlockN, class Work>
__device__ __forceinline__ RowInterval rows_seeing_key_block(const BwdParams& p, const Work& work, int32_t n_block) {
  const int64_t key0 = int64_t(n_block) * BlockN;
  const int64_t seqlen_k = work.seqlen_k(p);
  const int64_t key_last = (key0 + BlockN < seqlen_k ? key0 + BlockN : seqlen_k) - 1;
  const num::Mask& m = work.mask(p);
  RowInterval r{0, int64_t(work.seqlen_q(p)) - 1};
  if (m.right >= 0 && key0 - m.offset() - m.right > r.first) r.first = key0 - m.offset() - m.right;
  if (m.left >= 0 && key_last - m.offset() + m.left < r.last) r.last = key_last - m.offset() + m.left;
  if (key_last < key0) r.last = r.first - 1;
  return r;
}

template <int BlockM, int BlockN, class Work>
__device__ __forceinline__ bool key_block_sees_query_tile(const BwdParams& p, const Work& work, int32_t n_block,
                                                          int32_t m_block) {
  const RowInterval r = rows_seeing_key_block<BlockN>(p, work, n_block);
  return r.first <= r.last && r.first / BlockM <= m_block && m_block <= r.last / BlockM;
}

// Work item `item`'s work: dense (BwdWork) or, for the Varlen instances, its sequence's (BwdVarlenWork: the
// offsets read from cu_seqlens_q/k and seqused_k; a key block past the sequence's keys is empty and stores
// nothing).
template <int BlockM, int BlockN, bool Varlen>
__device__ __forceinline__ auto bwd_work(const BwdParams& p, int32_t item) {
  std::conditional_t<Varlen, BwdVarlenWork, BwdWork> w;
  const int32_t linear = item;
  const int32_t slot = linear % p.n_block_slots;
  w.kv_head = (linear / p.n_block_slots) % p.heads_kv;
  w.batch = linear / p.n_block_slots / p.heads_kv;
  if constexpr (Varlen) {
    SeqGeometry& g = w.geo;
    g.q_row0 = p.cu_seqlens_q[w.batch];
    g.seqlen_q = p.cu_seqlens_q[w.batch + 1] - g.q_row0;
    g.k_row0 = p.cu_seqlens_k[w.batch];
    g.seqlen_k = p.seqused_k != nullptr ? p.seqused_k[w.batch] : p.cu_seqlens_k[w.batch + 1] - g.k_row0;
    g.mask = p.mask;  // the window sides (clamped on the longest sequence: still wide enough for this one)
    g.mask.seqlen_q = g.seqlen_q;
    g.mask.seqlen_k = g.seqlen_k;
    w.seq_n_blocks = (g.seqlen_k + BlockN - 1) / BlockN;
  }
  // Deterministic: the last first, see dq_turn_of (a short sequence's slots past its keys come first and are
  // empty; a block still waits only for blocks of higher index, launched before it).
  w.n_block = p.deterministic ? p.n_block_slots - 1 - slot : slot;
  if (Varlen && w.n_block >= w.n_blocks(p)) return w;  // past the sequence's keys: empty, stores nothing
  RowInterval r = rows_seeing_key_block<BlockN>(p, w, w.n_block);
  if (!Varlen && p.cluster_pair) {
    // A pair (blocks 2j, 2j + 1: consecutive CTAs, n_block_slots even) walks the union of its two ranges, so both
    // CTAs take every step of the shared Q/dO stages and dQ exchange; a tile a block does not see is all masked
    // (P = dS = 0: its dQ half is zeros, dK and dV are unchanged).
    const RowInterval peer = rows_seeing_key_block<BlockN>(p, w, w.n_block ^ 1);
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

// The CTA's work items: blockIdx.x, then every gridDim.x-th (one item each unless the grid is persistent). Every
// role walks them in this order, so the CTAs of one round (blockIdx.x / n_block_slots) take the same (batch, kv
// head) at the same time: what the rotated walk's turns need (gridDim.x is a multiple of n_block_slots).
// Roles whose state carries from item to item (pipeline states, the dQ writers' turn) keep it outside `visit`.
template <int BlockM, int BlockN, bool Varlen, class Visit>
__device__ __forceinline__ void for_each_work_item(const BwdParams& p, Visit&& visit) {
#pragma unroll 1
  for (int32_t item = int32_t(blockIdx.x); item < p.work_items; item += int32_t(gridDim.x))
    visit(bwd_work<BlockM, BlockN, Varlen>(p, item));
}

// A cursor over the positions of a work item's walk: every query head of the kv head's group and, for each, the
// query tiles [m_begin, m_end), in that order; under the rotated walk from the key block's start position
// (RotatedWalk::start), wrapping from the group's last head to its first.
struct TileWalk {
  int32_t head = 0, m_block = 0, left = 0;
  template <class Work>
  __device__ __forceinline__ TileWalk(const BwdParams& p, const Work& work) {
    const int32_t tiles = work.m_end - work.m_begin;
    head = work.kv_head * p.group;
    m_block = work.m_begin;
    left = work.empty() ? 0 : tiles * p.group;
    if (p.rotated_walk && left > 0) {
      const int32_t s = RotatedWalk{uint32_t(work.n_blocks(p)), uint32_t(left)}.start(work.n_block);
      head += s / tiles;
      m_block += s % tiles;
    }
  }
  __device__ __forceinline__ bool more() const { return left > 0; }
  template <class Work>
  __device__ __forceinline__ void next(const BwdParams& p, const Work& work) {
    --left;
    if (++m_block < work.m_end) return;
    m_block = work.m_begin;
    if (++head == (work.kv_head + 1) * p.group) head = work.kv_head * p.group;  // the rotated walk's wrap
  }
};

// Deterministic mode: the key blocks that visit a query tile are consecutive (the row intervals move
// monotonically with the key block), and they add their dQ slabs from the last of them down: a block's turn on
// the tile is its distance from the last visitor. With causal masks the last visitor of a tile is the block on
// its diagonal, whose walk starts there, so every CTA's first tile needs no wait and the chains advance together
// (in ascending order, CTA n's first tile would wait for block 0 to walk down to it). Blocks are launched from the
// last down (bwd_work), so a CTA waits only for CTAs launched before it: no CTA waits for one not yet resident.
// With ws.chains = C > 1 the blocks form C chains (block n in chain n % C, adding into its own accumulator copy
// with its own counters, summed in a fixed order by the postprocess): a block's turn counts only the visitors of
// its chain after it, so the c-th CTA of a wave waits for c / C links before its first add, not c (perf-log B14).
// The rotated walk (p.rotated_walk: nothing masked, one chain) has its own order: RotatedWalk::turn of the tile's
// position (query head h's m_block) in the walk.
template <int BlockM, int BlockN, class Work>
__device__ __forceinline__ int32_t dq_turn_of(const BwdParams& p, const Work& work, int32_t h, int32_t m_block) {
  if (p.rotated_walk)
    return RotatedWalk{uint32_t(work.n_blocks(p)), uint32_t(p.group * p.m_tiles)}.turn(
        work.n_block, (h - work.kv_head * p.group) * p.m_tiles + m_block);
  const num::Mask& m = work.mask(p);
  const int32_t n_block = work.n_block, n_blocks = work.n_blocks(p);
  int32_t distance;  // from the last visitor of the tile
  if (m.left < 0) {
    // No left window: every block up to the last one that row_last sees visits the tile.
    if (m.right < 0) {
      distance = n_blocks - 1 - n_block;
    } else {
      const int64_t seqlen_q = work.seqlen_q(p);
      const int64_t row_last =
          (int64_t(m_block + 1) * BlockM < seqlen_q ? int64_t(m_block + 1) * BlockM : seqlen_q) - 1;
      const int64_t last_key = row_last + m.offset() + m.right;  // the last key row_last sees, if below seqlen_k
      const int64_t last = last_key / BlockN < n_blocks - 1 ? last_key / BlockN : int64_t(n_blocks) - 1;
      distance = int32_t(last) - n_block;
    }
  } else {
    // With a left window the visitors are at most window / block_n + 2 blocks: a short walk forward.
    int32_t last = n_block;
    while (last + 1 < n_blocks && key_block_sees_query_tile<BlockM, BlockN>(p, work, last + 1, m_block)) ++last;
    distance = last - n_block;
  }
  // The visitors after this block in its chain: those at distances C, 2C, ... (consecutive blocks).
  return p.ws.chains == 1 ? distance : distance / p.ws.chains;
}

// The turn chain (and accumulator copy) of the CTA's key block: 0 outside deterministic mode.
template <class Work>
__device__ __forceinline__ int32_t dq_chain_of(const BwdParams& p, const Work& work) {
  return p.ws.chains == 1 ? 0 : work.n_block % p.ws.chains;
}

}  // namespace fa4::sm90
