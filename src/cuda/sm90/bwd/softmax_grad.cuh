// Pieces both backward consumer roles use (mma.cuh: warpgroups own keys; mma_wide.cuh: warpgroups share the keys
// and split the head dim): Pᵀ and dSᵀ of a tile from Sᵀ, dPᵀ, LSE₂ and D (their 16-bit store to shared memory is
// tiles.cuh's store_tile16).
#pragma once

#include <cstdint>

#include "cuda/ptx/stmatrix.cuh"
#include "cuda/ptx/swizzle.hpp"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/bwd/params.hpp"
#include "cuda/sm90/bwd/work.cuh"
#include "cuda/sm90/tiles.cuh"
#include "cuda/trace/recorder.cuh"

namespace fa4::sm90 {

// Pᵀ and dSᵀ of one tile in place (s: Sᵀ -> Pᵀ, dp: dPᵀ -> dSᵀ), for this thread's key rows key[2] and the
// tile's queries from query0 (col_base: this thread's column-pair offset). lse/dsum: the stage's LSE₂ and D.
// Waits for the Sᵀ group, then for the dPᵀ group. Masked: the tile is not fully visible (every element tested);
// a fully visible tile's body has no mask code at all (softmax_grad_tile below picks the body per tile, as the
// forward's interior body, perf-log F6: a run-time flag left two compares and a select per element in both).
template <int BlockM, bool Masked, class Work>
__device__ __forceinline__ void softmax_grad_tile_body(const BwdParams& p, const Work& work,
                                                       ptx::WgmmaAccumulator<BlockM>& s,
                                                       ptx::WgmmaAccumulator<BlockM>& dp, const float* lse,
                                                       const float* dsum, const int64_t (&key)[2], int64_t query0,
                                                       int col_base, trace::Recorder& rec, int32_t m_block) {
  // The mask seen from a key: row i sees key j iff j - offset - right <= i <= j - offset + left (each side
  // unbounded when -1), and keys past seqlen_k see no row. Per row half, the interval of this thread's column
  // offsets (reg_col_in_pair_block) that see it, so each element costs two 32-bit compares.
  int32_t lo[2] = {0, 0}, hi[2] = {BlockM, BlockM};
  if constexpr (Masked) {
    const num::Mask& mask = work.mask(p);  // the sequence's (work.cuh)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t base = query0 + col_base;
      int64_t first = mask.right >= 0 ? key[h] - mask.offset() - mask.right - base : -1;
      int64_t last = mask.left >= 0 ? key[h] - mask.offset() + mask.left - base : BlockM;
      if (key[h] >= work.seqlen_k(p)) first = BlockM, last = -1;
      lo[h] = int32_t(first < -1 ? -1 : (first > BlockM ? BlockM : first));
      hi[h] = int32_t(last < -1 ? -1 : (last > BlockM ? BlockM : last));
    }
  }
  auto visible = [&](int i) {
    if constexpr (!Masked) return true;
    const int c = reg_col_in_pair_block(i), h = reg_row_half(i);
    return c >= lo[h] && c <= hi[h];
  };
  ptx::wgmma_wait_group<1>();  // Sᵀ landed; dPᵀ may still run
  ptx::wgmma_fence_operand(s);
  FA4_TRACE_RECORD(rec, trace::Kind::s_done, m_block);
  FA4_TRACE_RECORD(rec, trace::Kind::softmax_begin, m_block);
  if (!p.score.softcap) {
    const float c = p.score.scale_log2;
#pragma unroll
    for (int g = 0; g < BlockM / 8; ++g) {
      const float2 l = *reinterpret_cast<const float2*>(lse + 8 * g + col_base);
#pragma unroll
      for (int i = 4 * g; i < 4 * g + 4; ++i) s.reg[i] = visible(i) ? exp2_mufu(fmaf(s.reg[i], c, -((i & 1) ? l.y : l.x))) : 0.0f;
    }
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(dp);
#pragma unroll
    for (int g = 0; g < BlockM / 8; ++g) {
      const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * g + col_base);
#pragma unroll
      for (int i = 4 * g; i < 4 * g + 4; ++i) dp.reg[i] = s.reg[i] * (dp.reg[i] - ((i & 1) ? d.y : d.x));
    }
    return;
  }
  // Softcap: x = cap·tanh(s·scale/cap) in log2 units (cap_post = cap·log2e); dx/ds ∝ 1 − tanh².
#pragma unroll
  for (int i = 0; i < BlockM / 2; ++i) s.reg[i] = tanhf(s.reg[i] * p.score.cap_pre);
  ptx::wgmma_wait_group<0>();
  ptx::wgmma_fence_operand(dp);
#pragma unroll
  for (int g = 0; g < BlockM / 8; ++g) {
    const float2 l = *reinterpret_cast<const float2*>(lse + 8 * g + col_base);
    const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * g + col_base);
#pragma unroll
    for (int i = 4 * g; i < 4 * g + 4; ++i) {
      const float t = s.reg[i];
      const float prob = visible(i) ? exp2_mufu(fmaf(p.score.cap_post, t, -((i & 1) ? l.y : l.x))) : 0.0f;
      dp.reg[i] = prob * (dp.reg[i] - ((i & 1) ? d.y : d.x)) * (1.0f - t * t);
      s.reg[i] = prob;
    }
  }
}

template <int BlockM, class Work>
__device__ __forceinline__ void softmax_grad_tile(const BwdParams& p, const Work& work, ptx::WgmmaAccumulator<BlockM>& s,
                                                  ptx::WgmmaAccumulator<BlockM>& dp, const float* lse,
                                                  const float* dsum, const int64_t (&key)[2], int64_t query0,
                                                  int col_base, bool masked, trace::Recorder& rec,
                                                  int32_t m_block) {
  if (masked)
    softmax_grad_tile_body<BlockM, true>(p, work, s, dp, lse, dsum, key, query0, col_base, rec, m_block);
  else
    softmax_grad_tile_body<BlockM, false>(p, work, s, dp, lse, dsum, key, query0, col_base, rec, m_block);
}

}  // namespace fa4::sm90
