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

template <int BlockM, int BlockN>
__device__ __forceinline__ BwdWork bwd_work(const BwdParams& p) {
  BwdWork w;
  const int32_t linear = int32_t(blockIdx.x);
  w.n_block = linear % p.n_blocks;
  w.kv_head = (linear / p.n_blocks) % p.heads_kv;
  w.batch = linear / p.n_blocks / p.heads_kv;
  const int64_t key0 = int64_t(w.n_block) * BlockN;
  const int64_t key_last = (key0 + BlockN < p.seqlen_k ? key0 + BlockN : int64_t(p.seqlen_k)) - 1;
  // Row i sees a key of [key0, key_last] iff key_end(i) > key0 and key_begin(i) <= key_last; both ends grow
  // with i, so the rows form one interval.
  const num::Mask& m = p.mask;
  int64_t first = 0, last = int64_t(p.seqlen_q) - 1;
  if (m.right >= 0) first = key0 - m.offset() - m.right > first ? key0 - m.offset() - m.right : first;
  if (m.left >= 0) last = key_last - m.offset() + m.left < last ? key_last - m.offset() + m.left : last;
  if (first <= last && key_last >= key0) {
    w.m_begin = int32_t(first / BlockM);
    w.m_end = int32_t(last / BlockM + 1);
  }
  return w;
}

// Whether every (query, key) of the tile pair is visible (then no per-element predicate): keys inside
// seqlen_k and inside every valid row's window. Rows past seqlen_q have LSE₂ = +inf (P = 0) and do not count.
template <int BlockM, int BlockN>
__device__ __forceinline__ bool bwd_tile_fully_visible(const BwdParams& p, int32_t m_block, int32_t n_block) {
  const int64_t row0 = int64_t(m_block) * BlockM;
  const int64_t row_last = (row0 + BlockM < p.seqlen_q ? row0 + BlockM : int64_t(p.seqlen_q)) - 1;
  const int64_t key0 = int64_t(n_block) * BlockN, key_end = key0 + BlockN;
  return key_end <= p.seqlen_k && key0 >= p.mask.key_begin(row_last) && key_end <= p.mask.key_end(row0);
}

}  // namespace fa4::sm90
