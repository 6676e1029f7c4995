// Epilogue role of the consumer warpgroup: finish the row sums over the quad, O / l, round to the output dtype
// and store; LSE (natural log, fp32). A row with no visible key has l = 0: O = 0 and LSE = -inf
// (num::finalize_row). Rows past seqlen_q are never written. Plain stores for now (a TMA store through shared
// memory is a later step); each thread writes its two rows' column pairs.
#pragma once

#include <cstdint>

#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/mma_softmax.cuh"
#include "cuda/sm90/params.hpp"
#include "cuda/sm90/scheduler.cuh"
#include "numerics/online_softmax.hpp"

namespace fa4::sm90 {

template <ptx::WgmmaInput In, int HeadDim, int BlockM>
__device__ void epilogue_role(const FwdParams& p, const WorkTile& tile, ptx::WgmmaAccumulator<HeadDim>& o,
                              RowState& rows) {
  const int thread = threadIdx.x % kWarpgroupThreads;
  const int64_t row0 = int64_t(tile.m_block) * BlockM + ptx::accumulator_row(thread, 0);
  const int col_base = 2 * (thread % 4);

  float inv_l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const num::RowFinal fin = num::finalize_row(rows.m[h], quad_sum(rows.l[h]));
    inv_l[h] = fin.inv_l;
    const int64_t r = row0 + 8 * h;
    if (p.lse != nullptr && thread % 4 == 0 && r < p.seqlen_q)
      p.lse[tile.batch * p.lse_stride_b + tile.head * p.lse_stride_h + r * p.lse_stride_s] = fin.lse;
  }

  uint16_t* const out = static_cast<uint16_t*>(p.out) + tile.batch * p.out_stride_b + tile.head * p.out_stride_h;
#pragma unroll
  for (int i = 0; i < HeadDim / 2; i += 2) {
    const int h = reg_row_half(i);
    const int64_t r = row0 + 8 * h;
    if (r >= p.seqlen_q) continue;
    const uint32_t pair = ptx::pack_rn<In>(o.reg[i] * inv_l[h], o.reg[i + 1] * inv_l[h]);
    uint16_t* dst = out + r * p.out_stride_s + col_base + reg_col_in_pair_block(i);
    if (p.out_pairs_aligned) {
      *reinterpret_cast<uint32_t*>(dst) = pair;
    } else {
      dst[0] = static_cast<uint16_t>(pair & 0xFFFFu);
      dst[1] = static_cast<uint16_t>(pair >> 16);
    }
  }
}

}  // namespace fa4::sm90
