// Which work a backward CTA owns and which query tiles it visits. The grid is one CTA per (key block, kv head,
// batch), key blocks fastest (the CTAs running together read the same Q/dO from L2). A CTA walks every query
// head of its kv head's group and, for each, the query tiles [begin, end) that see at least one of its keys.
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
  w.n_block = linear % p.n_blocks;
  w.kv_head = (linear / p.n_blocks) % p.heads_kv;
  w.batch = linear / p.n_blocks / p.heads_kv;
  const RowInterval r = rows_seeing_key_block<BlockN>(p, w.n_block);
  if (r.first <= r.last) {
    w.m_begin = int32_t(r.first / BlockM);
    w.m_end = int32_t(r.last / BlockM + 1);
  }
  return w;
}

// Deterministic mode: the key blocks that visit a query tile are consecutive (the row intervals move
// monotonically with the key block), so a block's turn on the tile is its distance from the first of them.
template <int BlockM, int BlockN>
__device__ __forceinline__ int32_t dq_turn_of(const BwdParams& p, int32_t n_block, int32_t m_block) {
  // Without a left window key block 0 sees every row that sees any key, so the first visitor is block 0.
  if (p.mask.left < 0) return n_block;
  // With one, the visitors are at most window / block_n + 2 blocks: a short walk back.
  int32_t first = n_block;
  while (first > 0 && key_block_sees_query_tile<BlockM, BlockN>(p, first - 1, m_block)) --first;
  return n_block - first;
}


}  // namespace fa4::sm90
