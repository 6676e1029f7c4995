// Backward epilogue of a consumer warpgroup: dK (times the softmax scale) and dV of its 64 keys, from the
// accumulators to global memory at the tensors' own strides, column pairs as one 32-bit store where aligned.
// Keys past seqlen_k are not stored. A CTA whose keys no query sees stores zeros.
#pragma once

#include <cstdint>

#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/bwd/params.hpp"
#include "cuda/sm90/bwd/work.cuh"
#include "cuda/sm90/tiles.cuh"

namespace fa4::sm90 {

template <ptx::WgmmaInput In, int HeadDim>
__device__ __forceinline__ void store_key_rows(const StridedRows& t, const ptx::WgmmaAccumulator<HeadDim>& acc,
                                               float factor, const BwdParams& p, const BwdWork& work,
                                               int64_t key_row0) {
  const int thread = threadIdx.x % kWarpgroupThreads;
#pragma unroll
  for (int i = 0; i < HeadDim / 2; i += 2) {
    const int64_t key = key_row0 + 8 * reg_row_half(i);
    if (key >= p.seqlen_k) continue;
    const int col = ptx::accumulator_col(thread, i);
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

template <ptx::WgmmaInput In, int HeadDim, int BlockN>
__device__ __forceinline__ void bwd_epilogue_role(const BwdParams& p, const BwdWork& work, int consumer,
                                                  const ptx::WgmmaAccumulator<HeadDim>& dk,
                                                  const ptx::WgmmaAccumulator<HeadDim>& dv) {
  const int thread = threadIdx.x % kWarpgroupThreads;
  const int64_t key_row0 = int64_t(work.n_block) * BlockN + consumer * kWgmmaM + ptx::accumulator_row(thread, 0);
  store_key_rows<In, HeadDim>(p.dk, dk, p.scale, p, work, key_row0);
  store_key_rows<In, HeadDim>(p.dv, dv, 1.0f, p, work, key_row0);
}

}  // namespace fa4::sm90
