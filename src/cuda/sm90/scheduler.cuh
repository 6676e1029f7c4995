// Which work tile a CTA owns and which K/V tiles it visits. Non-persistent for now: one CTA per (query block,
// head, batch) on a 1-D grid. Query blocks are handed out last-first so that, under a causal mask, the longest
// rows start first (LPT) and the short ones fill the tail.
#pragma once

#include <cstdint>

#include "cuda/sm90/params.hpp"

namespace fa4::sm90 {

struct WorkTile {
  int32_t m_block;  // query rows [64·m_block, 64·m_block + block_m)
  int32_t head;     // query head
  int32_t batch;
};

__device__ __forceinline__ WorkTile work_tile(const FwdParams& p, uint32_t linear) {
  WorkTile t;
  const uint32_t per_batch = uint32_t(p.num_m_blocks) * uint32_t(p.heads_q);
  t.batch = int32_t(linear / per_batch);
  const uint32_t rest = linear - uint32_t(t.batch) * per_batch;
  t.head = int32_t(rest / uint32_t(p.num_m_blocks));
  t.m_block = p.num_m_blocks - 1 - int32_t(rest % uint32_t(p.num_m_blocks));
  return t;
}

// K/V tiles [begin, end) that hold at least one key visible to a valid row of the tile: the union of the rows'
// visible ranges (both ends are monotone in the row). Empty when seqlen_k is 0 or every row is masked out.
struct KvTileRange {
  int32_t begin = 0, end = 0;
  __device__ __forceinline__ bool empty() const { return end <= begin; }
};

template <int BlockM, int BlockN>
__device__ __forceinline__ KvTileRange kv_tile_range(const FwdParams& p, int32_t m_block) {
  const int64_t row0 = int64_t(m_block) * BlockM;
  const int64_t row_last = (row0 + BlockM < p.seqlen_q ? row0 + BlockM : int64_t(p.seqlen_q)) - 1;
  const int64_t key_begin = p.mask.key_begin(row0);
  const int64_t key_end = p.mask.key_end(row_last);
  KvTileRange r;
  if (key_end <= key_begin || p.seqlen_k == 0) return r;
  r.begin = int32_t(key_begin / BlockN);
  r.end = int32_t((key_end + BlockN - 1) / BlockN);
  return r;
}

// Whether every element of the (query tile, key tile) block is visible: then the softmax skips the per-element
// predicates. Rows past seqlen_q are never stored, so they do not count.
template <int BlockM, int BlockN>
__device__ __forceinline__ bool kv_tile_fully_visible(const FwdParams& p, int32_t m_block, int32_t n_block) {
  const int64_t row0 = int64_t(m_block) * BlockM;
  const int64_t row_last = (row0 + BlockM < p.seqlen_q ? row0 + BlockM : int64_t(p.seqlen_q)) - 1;
  const int64_t key0 = int64_t(n_block) * BlockN, key_end = key0 + BlockN;
  return key_end <= p.seqlen_k && key0 >= p.mask.key_begin(row_last) && key_end <= p.mask.key_end(row0);
}

}  // namespace fa4::sm90
