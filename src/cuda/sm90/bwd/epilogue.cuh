// Backward epilogue of a consumer warpgroup: dK (times the softmax scale) and dV of its 64 keys (column-split
// rows: of its head-dim chunks), from the accumulators to global memory at the tensors' own strides, column
// pairs as one 32-bit store where aligned, or (dK and dV both TMA-addressable) staged in the K/V tiles and
// stored by TMA. Keys past seqlen_k are not stored. A CTA whose keys no query sees stores zeros.
#pragma once

#include <cstdint>

#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/named_barrier.cuh"
#include "cuda/ptx/swizzle.hpp"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/bwd/config.hpp"
#include "cuda/sm90/bwd/params.hpp"
#include "cuda/sm90/bwd/work.cuh"
#include "cuda/sm90/tiles.cuh"

namespace fa4::sm90 {

// Stores a 64 × N accumulator (rows from key_row0 of the work's sequence, head-dim columns from col0) times
// `factor`.
template <ptx::WgmmaInput In, int N, class Work>
__device__ __forceinline__ void store_key_rows(const StridedRows& t, const ptx::WgmmaAccumulator<N>& acc, float factor,
                                               const BwdParams& p, const Work& work, int64_t key_row0,
                                               int col0 = 0) {
  const int thread = threadIdx.x % kWarpgroupThreads;
#pragma unroll
  for (int i = 0; i < N / 2; i += 2) {
    const int64_t key = key_row0 + 8 * reg_row_half(i);
    if (key >= work.seqlen_k(p)) continue;
    const int col = col0 + ptx::accumulator_col(thread, i);
    uint16_t* dst = static_cast<uint16_t*>(t.data) + int64_t(work.tensor_batch()) * t.stride_b +
                    (work.k_row0() + key) * t.stride_s + int64_t(work.kv_head) * t.stride_h + col;
    const uint32_t packed = ptx::pack_rn<In>(acc.reg[i] * factor, acc.reg[i + 1] * factor);
    if (t.pairs_aligned) {
      *reinterpret_cast<uint32_t*>(dst) = packed;
    } else {
      dst[0] = uint16_t(packed & 0xffffu);
      dst[1] = uint16_t(packed >> 16);
    }
  }
}

// Stages a 64 × N accumulator (times `factor`) in the 128B-swizzled image of a [chunks][tile_rows][128 B] tile,
// at rows row0 .. row0 + 63 and chunks from chunk0: the image a {64, 64} TMA store box reads.
template <ptx::WgmmaInput In, int N>
__device__ __forceinline__ void stage_key_rows(uint8_t* tile, int tile_rows, int row0, int chunk0,
                                               const ptx::WgmmaAccumulator<N>& acc, float factor) {
  const int thread = threadIdx.x % kWarpgroupThreads;
  const int local_row0 = ptx::accumulator_row(thread, 0);
#pragma unroll
  for (int i = 0; i < N / 2; i += 2) {
    const int col = ptx::accumulator_col(thread, i);
    uint8_t* chunk = tile + (chunk0 + col / kSw128Columns) * tile_rows * ptx::kSw128RowBytes + row0 * ptx::kSw128RowBytes;
    *reinterpret_cast<uint32_t*>(chunk + ptx::sw128_offset(local_row0 + 8 * reg_row_half(i), col % kSw128Columns, 2)) =
        ptx::pack_rn<In>(acc.reg[i] * factor, acc.reg[i + 1] * factor);
  }
}

// first_key: the first of the warpgroup's 64 keys; col0: its first head-dim column. With p.dkv_tma, dK and dV go
// through the CTA's K and V tiles (k_tile, v_tile: [chunks][tile_rows][128 B]) and TMA stores: every consumer
// warpgroup first passes its last GEMM (they all read the whole tiles), then each writes its own rows and
// chunks, and one thread stores them, waiting only until the stores have read shared memory (the global writes
// finish after the CTA exits or moves on, under the next work). Rows past seqlen_k are clipped by the map. Varlen work
// stores per thread (a box would write past its sequence into the next one's rows).
template <ptx::WgmmaInput In, int N, class Work>
__device__ __forceinline__ void bwd_epilogue_role(const BwdParams& p, const Work& work, int64_t first_key, int col0,
                                                  const ptx::WgmmaAccumulator<N>& dk,
                                                  const ptx::WgmmaAccumulator<N>& dv, uint8_t* k_tile,
                                                  uint8_t* v_tile, int tile_rows, int consumer, int consumers) {
  // An empty item (no query sees its keys) stores its zeros per thread: its CTA holds no K/V stage, which the next
  // item's load may be filling (a persistent grid).
  if (Work::kVarlen || !p.dkv_tma || work.empty()) {
    const int64_t key_row0 = first_key + ptx::accumulator_row(threadIdx.x % kWarpgroupThreads, 0);
    store_key_rows<In, N>(p.dk, dk, p.scale, p, work, key_row0, col0);
    store_key_rows<In, N>(p.dv, dv, 1.0f, p, work, key_row0, col0);
    return;
  }
  static_assert(N % kSw128Columns == 0, "whole 64-column chunks per warpgroup");
  ptx::named_barrier_sync_any_site(static_cast<uint32_t>(BwdBarrier::ds_ready), uint32_t(consumers) * kWarpgroupThreads);
  const int row0 = int(first_key - int64_t(work.n_block) * tile_rows), chunk0 = col0 / kSw128Columns;
  stage_key_rows<In, N>(k_tile, tile_rows, row0, chunk0, dk, p.scale);
  stage_key_rows<In, N>(v_tile, tile_rows, row0, chunk0, dv, 1.0f);
  ptx::fence_proxy_async_shared_cta();  // the generic writes above, before the async-proxy stores read them
  ptx::named_barrier_sync(static_cast<uint32_t>(BwdBarrier::first_warpgroup) + uint32_t(consumer), kWarpgroupThreads);
  if (threadIdx.x % kWarpgroupThreads == 0 && first_key < p.seqlen_k) {  // a pair's phantom block stores nothing
#pragma unroll
    for (int c = 0; c < N / kSw128Columns; ++c) {
      const int32_t coords[4] = {col0 + c * kSw128Columns, int32_t(first_key), work.kv_head, work.batch};
      const size_t offset = size_t(chunk0 + c) * tile_rows * ptx::kSw128RowBytes + size_t(row0) * ptx::kSw128RowBytes;
      ptx::tma_store(&p.dk_map, coords, k_tile + offset);
      ptx::tma_store(&p.dv_map, coords, v_tile + offset);
    }
    ptx::tma_store_commit();
    ptx::tma_store_wait_read<0>();  // shared memory must outlive the reads; the writes complete on their own
  }
}

}  // namespace fa4::sm90
