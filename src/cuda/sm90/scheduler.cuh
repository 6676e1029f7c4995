// Which work tiles a CTA owns and which K/V tiles each visits. The grid is persistent (one CTA per SM, launch.cu)
// and walks tiles in a linear order:
//   non-causal: static, CTA c takes c, c + grid, c + 2·grid, ... of the static order (tile_order.hpp);
//   causal:     dynamic longest-first (LPT): CTA c starts at tile c of the LPT order, and a CTA that finishes
//               takes the next tile from a global counter, so the short tiles fill the tail (a static snake
//               over the same order, without the counter's per-call memset, lost 8-18% at 2k-8k: perf-log F11).
// The producer warp picks the next tile and publishes it to the consumers through a shared-memory ring
// (kernel_fwd.cu), so every role of a CTA works on the same tile.
#pragma once

#include <cstdint>

#include "cuda/sm90/config.hpp"
#include "cuda/sm90/params.hpp"
#include "cuda/sm90/seq_geometry.hpp"
#include "cuda/sm90/tile_order.hpp"

namespace fa4::sm90 {

// The producer's walk over tiles: first() and next() give linear tile indices; num_tiles or more means done.
// A variable-length batch (Varlen with cu_seqlens_q) walks the static order through the counter too (launch.cu
// hands it one unless FA4_FWD_VARLEN_COUNTER=0): its order covers every sequence up to the longest one's query
// blocks, so a fixed stride gave some CTAs mostly the empty tiles past short sequences and others the long
// sequences' full ones (perf-log F24, H100: the counter +13% at d = 64 and d = 128, +6-9% causal).
// The dense kernels keep the test on lpt alone (their SASS unchanged); the KV-cache calls get no counter.
template <bool Varlen>
class TileScheduler {
 public:
  __device__ explicit TileScheduler(const FwdParams& p) : p_(p) {}
  __device__ int32_t first() const { return int32_t(blockIdx.x); }
  __device__ int32_t next(int32_t current) const {
    const bool counted = Varlen ? p_.tile_counter != nullptr : p_.order.lpt;
    if (!counted) return current + int32_t(gridDim.x);
    // Every CTA's first tile is its blockIdx; the counter hands out the rest in order.
    return int32_t(gridDim.x) + int32_t(atomicAdd(p_.tile_counter, 1u));
  }

 private:
  const FwdParams& p_;
};

// K/V tiles [begin, end) that hold at least one key visible to a valid row of the tile: the union of the rows'
// visible ranges (both ends are monotone in the row). Empty when seqlen_k is 0 or every row is masked out. With
// split-KV the union is cut into order.num_splits ranges of whole tiles, as even as they go (the last ones may
// be empty when the union has fewer tiles than splits).
struct KvTileRange {
  int32_t begin = 0, end = 0;
  __device__ __forceinline__ bool empty() const { return end <= begin; }
};

// The sequence a tile belongs to (seq_geometry.hpp). A dense kernel reads p directly, as before; only the Varlen
// instances load the offsets.
// A KV-cache call (cu_seqlens null) has dense queries and a cache per sequence: offsets 0, the sequence's keys
// from seqused_k (cache_seqlens) plus the keys appended in this call.
__device__ __forceinline__ SeqGeometry seq_geometry(const FwdParams& p, const WorkTile& tile) {
  SeqGeometry g;
  if (p.cu_seqlens_q != nullptr) {
    g.q_row0 = p.cu_seqlens_q[tile.batch];
    g.seqlen_q = p.cu_seqlens_q[tile.batch + 1] - g.q_row0;
  } else {
    g.seqlen_q = p.seqlen_q;
  }
  if (p.cu_seqlens_k != nullptr) {
    g.k_row0 = p.cu_seqlens_k[tile.batch];
    g.seqlen_k = p.seqused_k != nullptr ? p.seqused_k[tile.batch] : p.cu_seqlens_k[tile.batch + 1] - g.k_row0;
  } else {
    g.seqlen_k = (p.seqused_k != nullptr ? p.seqused_k[tile.batch] : p.seqlen_k) + p.seqlen_k_added;
  }
  g.mask = p.mask;  // the window sides (clamped on the longest sequence: still wide enough for this one)
  g.mask.seqlen_q = g.seqlen_q;
  g.mask.seqlen_k = g.seqlen_k;
  return g;
}

// Part `split` of `splits` of a range: whole tiles, as even as they go.
__device__ __forceinline__ KvTileRange split_part(KvTileRange r, int32_t split, int32_t splits) {
  const int32_t n = r.end - r.begin, first = r.begin;
  r.begin = first + int32_t(int64_t(n) * split / splits);
  r.end = first + int32_t(int64_t(n) * (split + 1) / splits);
  return r;
}

template <int BlockM, int BlockN>
__device__ __forceinline__ KvTileRange kv_tile_range(const FwdParams& p, const WorkTile& tile) {
  int64_t row0 = int64_t(tile.m_block) * BlockM;
  const int64_t row_last = (row0 + BlockM < p.seqlen_q ? row0 + BlockM : int64_t(p.seqlen_q)) - 1;
  if constexpr (kTopPad) row0 = row0 < p.m_shift ? p.m_shift : row0;  // the first row that is q's (FA4_AB_TOP_PAD)
  const int64_t key_begin = p.mask.key_begin(row0);
  const int64_t key_end = p.mask.key_end(row_last);
  KvTileRange r;
  if (key_end <= key_begin || p.seqlen_k == 0) return r;
  r.begin = int32_t(key_begin / BlockN);
  r.end = int32_t((key_end + BlockN - 1) / BlockN);
  if (p.order.num_splits > 1) {
    const int32_t n = r.end - r.begin, splits = p.order.num_splits;
    const int32_t first = r.begin;
    r.begin = first + int32_t(int64_t(n) * tile.split / splits);
    r.end = first + int32_t(int64_t(n) * (tile.split + 1) / splits);
  }
  return r;
}

// The same for a tile of one sequence (its sizes and mask; split only in a KV-cache call, whose queries are
// dense). The order covers the longest sequence, so a tile may lie past its sequence's rows: then the range is
// empty.
template <int BlockM, int BlockN>
__device__ __forceinline__ KvTileRange kv_tile_range_in_sequence(const FwdParams& p, const WorkTile& tile,
                                                                 const SeqGeometry& g) {
  const int64_t row0 = int64_t(tile.m_block) * BlockM;
  KvTileRange r;
  if (row0 >= g.seqlen_q || g.seqlen_k == 0) return r;
  const int64_t row_last = (row0 + BlockM < g.seqlen_q ? row0 + BlockM : int64_t(g.seqlen_q)) - 1;
  const int64_t key_begin = g.mask.key_begin(row0);
  const int64_t key_end = g.mask.key_end(row_last);
  if (key_end <= key_begin) return r;
  r.begin = int32_t(key_begin / BlockN);
  r.end = int32_t((key_end + BlockN - 1) / BlockN);
  if (p.order.num_splits > 1) r = split_part(r, tile.split, p.order.num_splits);
  return r;
}

// The tile's K/V tiles for a consumer: a dense tile's from p (geo untouched), a varlen tile's from its sequence
// (geo filled in for the caller). The dense kernels' SASS is the same as with kv_tile_range called directly.
template <int BlockM, int BlockN, bool Varlen>
__device__ __forceinline__ KvTileRange tile_kv_range(const FwdParams& p, const WorkTile& tile, SeqGeometry& geo) {
  if constexpr (Varlen) {
    geo = seq_geometry(p, tile);
    return kv_tile_range_in_sequence<BlockM, BlockN>(p, tile, geo);
  } else {
    return kv_tile_range<BlockM, BlockN>(p, tile);
  }
}

}  // namespace fa4::sm90
