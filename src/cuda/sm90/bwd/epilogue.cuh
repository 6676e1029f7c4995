// Backward epilogue of a consumer warpgroup: dK (times the softmax scale) and dV of its 64 keys (column-split
// rows: of its head-dim chunks), from the accumulators to global memory at the tensors' own strides, column
// pairs as one 32-bit store where aligned. Keys past seqlen_k are not stored. A CTA whose keys no query sees
// stores zeros.
#pragma once

#include <cstdint>

#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/bwd/params.hpp"
#include "cuda/sm90/bwd/work.cuh"
#include "cuda/sm90/tiles.cuh"

namespace fa4::sm90 {

// Stores a 64 × N accumulator (rows from key_row0, head-dim columns from col0) times `factor`.
template <ptx::WgmmaInput In, int N>
__device__ __forceinline__ void store_key_rows(const StridedRows& t, const ptx::WgmmaAccumulator<N>& acc, float factor,
                                               const BwdParams& p, const BwdWork& work, int64_t key_row0,
                                               int col0 = 0) {
  const int thread = threadIdx.x % kWarpgroupThreads;
#pragma unroll
  for (int i = 0; i < N / 2; i += 2) {
    const int64_t key = key_row0 + 8 * reg_row_half(i);
    if (key >= p.seqlen_k) continue;
    const int col = col0 + ptx::accumulator_col(thread, i);
    uint16_t* dst = static_cast<uint16_t*>(t.data) + int64_t(work.batch) * t.stride_b + key * t.stride_s +
                    int64_t(work.kv_head) * t.stride_h + col;
    const uint32_t packed = ptx::pack_rn<In>(acc.reg[i] * factor, acc.reg[i + 1] * factor);
    if (t.pairs_aligned) {
      *reinterpret_cast<uint32_t*>(dst) = packed;
    } else {
      dst[0] = uint16_t(packed & 0xffffu);
      dst[1] = uint16_t(packed >> 16);
    }
  }
}

// first_key: the first of the warpgroup's 64 keys; col0: its first head-dim column.
template <ptx::WgmmaInput In, int N>
__device__ __forceinline__ void bwd_epilogue_role(const BwdParams& p, const BwdWork& work, int64_t first_key, int col0,
                                                  const ptx::WgmmaAccumulator<N>& dk,
                                                  const ptx::WgmmaAccumulator<N>& dv) {
  const int64_t key_row0 = first_key + ptx::accumulator_row(threadIdx.x % kWarpgroupThreads, 0);
  store_key_rows<In, N>(p.dk, dk, p.scale, p, work, key_row0, col0);
  store_key_rows<In, N>(p.dv, dv, 1.0f, p, work, key_row0, col0);
}

}  // namespace fa4::sm90
