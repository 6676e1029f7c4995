// MMA + softmax + correction roles of the consumer warpgroup (one per CTA for now; DESIGN.md §6 step 4, first
// half: correctness before overlap). Per visible K/V tile n:
//   S = Q·Kₙᵀ (SS wgmma, both K-major)  ->  wait  ->  release Kₙ
//   x = score(S) in log2 units, masked to -inf; per-row block max over the quad (4 lanes hold a row)
//   correction: per-row conditional rescale (num::update_row_max with tau); O and l are multiplied only if some
//               row of the warp moved its reference max, so most tiles skip the O pass entirely
//   P = exp2(x - m): MUFU ex2.approx, or num::exp2_emulated for the key-column groups the policy sends to the
//       FMA pipe (bitwise the host's emulation); l += P (thread-local, reduced over the quad once at the end)
//   O += P·Vₙ (RS wgmma: P rounded to 16 bits straight from the S registers, V MN-major)  ->  wait  ->  release Vₙ
#pragma once

#include <cstdint>

#include "cuda/pipeline/pipeline.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "numerics/exp2.hpp"
#include "numerics/mask.hpp"
#include "numerics/online_softmax.hpp"

namespace fa4::sm90 {

// Per-thread softmax state of its two accumulator rows (r and r + 8 of the warpgroup's 64, fa3.md §3.5).
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};  // reference max, log2 units (may be stale by up to tau)
  float l[2] = {0.0f, 0.0f};            // this thread's share of sum exp2(x - m); quad-reduced in the epilogue
};

// Consumer releases: one arrival per consumer warp, each after its own wgmma wait (so no warp's view of the
// tile can still be in use), hence consumer_arrivals = 4 per consumer warpgroup at ring init.
inline constexpr uint32_t kReleasesPerConsumerWarpgroup = 4;

__device__ __forceinline__ float exp2_mufu(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Max over the 4 lanes of a quad (lanes 4q .. 4q+3 hold the columns of the same two rows).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Accumulator register i of a thread: row half (i/2)%2 (row r or r + 8), column 8·(i/4) + 2c + i%2.
__device__ __forceinline__ constexpr int reg_row_half(int i) { return (i >> 1) & 1; }
__device__ __forceinline__ constexpr int reg_col_in_pair_block(int i) { return 8 * (i >> 2) + (i & 1); }

// S = Q·Kᵀ over head_dim / 16 k-steps; both tiles [head_dim/64 chunks][rows][128 B].
template <ptx::WgmmaInput In, int HeadDim, int BlockM, int BlockN>
__device__ __forceinline__ void gemm_qk(ptx::WgmmaAccumulator<BlockN>& s, uint32_t q_tile, uint32_t k_tile) {
  ptx::wgmma_fence_operand(s);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HeadDim / 16; ++kk) {
    // k-step kk: chunk kk/4 (rows·128 bytes each), 32 bytes per k-step of 16 elements inside the 128-byte row.
    const auto a = ptx::sw128_k_major_desc(q_tile + (kk / 4) * uint32_t(BlockM) * 128u + (kk % 4) * 32u);
    const auto b = ptx::sw128_k_major_desc(k_tile + (kk / 4) * uint32_t(BlockN) * 128u + (kk % 4) * 32u);
    ptx::wgmma_ss<In, ptx::Major::k, ptx::Major::k>(s, a, b, /*accumulate=*/kk > 0);
  }
  ptx::wgmma_commit_group();
  ptx::wgmma_wait_group<0>();
  ptx::wgmma_fence_operand(s);
}

// O += P·V over block_n / 16 k-steps; V tile [head_dim/64 chunks][block_n rows][128 B] read MN-major: a k-step
// of 16 key rows is 2048 bytes, the 64-wide head-dim chunks are block_n·128 bytes apart (LBO).
template <ptx::WgmmaInput In, int HeadDim, int BlockN>
__device__ __forceinline__ void gemm_pv(ptx::WgmmaAccumulator<HeadDim>& o, ptx::WgmmaFragmentA (&p)[BlockN / 16],
                                        uint32_t v_tile) {
  ptx::wgmma_fence_operand(o);
#pragma unroll
  for (int kb = 0; kb < BlockN / 16; ++kb) ptx::wgmma_fence_operand(p[kb]);
  ptx::wgmma_fence();  // O may have been rescaled and P was just packed by ordinary instructions
#pragma unroll
  for (int kb = 0; kb < BlockN / 16; ++kb)
    ptx::wgmma_rs<In, ptx::Major::mn>(o, p[kb], ptx::sw128_mn_major_desc(v_tile + kb * 2048u, BlockN * 128u),
                                      /*accumulate=*/true);
  ptx::wgmma_commit_group();
  ptx::wgmma_wait_group<0>();  // P's registers are rewritten by the next tile
  ptx::wgmma_fence_operand(o);
#pragma unroll
  for (int kb = 0; kb < BlockN / 16; ++kb) ptx::wgmma_fence_operand(p[kb]);
}

// Softmax + correction of one S tile in place (S becomes P in fp32), for the thread's rows `row[2]` and the
// tile's keys starting at key0 (this thread's column pair offset included in col_base).
template <int BlockN, int HeadDim>
__device__ __forceinline__ void softmax_tile(const FwdParams& p, ptx::WgmmaAccumulator<BlockN>& s,
                                             ptx::WgmmaAccumulator<HeadDim>& o, RowState& rows,
                                             const int64_t (&row)[2], int64_t key0, int col_base, bool masked) {
  // Scores in log2 units, masked elements (and keys past seqlen_k) at -inf.
  int64_t key_begin[2], key_end[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    key_begin[h] = p.mask.key_begin(row[h]);
    key_end[h] = p.mask.key_end(row[h]);
  }
  float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < BlockN / 2; ++i) {
    const int h = reg_row_half(i);
    float x = p.score(s.reg[i]);
    if (masked) {
      const int64_t key = key0 + col_base + reg_col_in_pair_block(i);
      x = (key >= key_begin[h] && key < key_end[h]) ? x : -INFINITY;
    }
    s.reg[i] = x;
    block_max[h] = fmaxf(block_max[h], x);
  }

  // Correction: per-row decision; the O pass runs only when some row of this warp moved its max.
  float factor[2];
  bool any_rescaled = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const num::RowMaxUpdate u = num::update_row_max(rows.m[h], quad_max(block_max[h]), p.rescale_threshold);
    factor[h] = u.rescaled ? exp2_mufu(u.log2_scale) : 1.0f;
    any_rescaled = any_rescaled || u.rescaled;
    rows.m[h] = u.m;
    rows.l[h] *= factor[h];
  }
  if (__any_sync(0xffffffffu, any_rescaled)) {
#pragma unroll
    for (int i = 0; i < HeadDim / 2; ++i) o.reg[i] *= factor[reg_row_half(i)];
  }

  // P = exp2(x - m). The subtraction is an explicit round-to-nearest op so that it is never fused with the
  // scale multiply: emulated elements then see exactly the host's argument.
  const float m_sub[2] = {num::safe_max(rows.m[0]), num::safe_max(rows.m[1])};
#pragma unroll
  for (int g = 0; g < BlockN / 8; ++g) {
    // Register group g = key columns key0 + 8g .. +7 for every lane: the emulation choice is warp-uniform.
    const bool emulated = num::exp2_is_emulated(key0 + 8 * g, p.exp2_emulated_per16);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * g + j, h = reg_row_half(i);
      const float arg = __fsub_rn(s.reg[i], m_sub[h]);
      const float e = emulated ? num::exp2_emulated(arg) : exp2_mufu(arg);
      s.reg[i] = e;
      rows.l[h] += e;
    }
  }
}

// The consumer warpgroup's main loop over the visible K/V tiles. On return O holds the unnormalised output of
// this thread's rows and `rows` their (m, thread-local l).
template <ptx::WgmmaInput In, int HeadDim>
__device__ void mma_softmax_role(const FwdParams& p, FwdSharedStorage<HeadDim>& smem, const WorkTile& tile,
                                 ptx::WgmmaAccumulator<HeadDim>& o, RowState& rows) {
  using Config = FwdConfig<HeadDim>;
  using Ring = cuda::Pipeline<Config::kStages>;
  constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;

#pragma unroll
  for (int i = 0; i < HeadDim / 2; ++i) o.reg[i] = 0.0f;
  const KvTileRange range = kv_tile_range<kBlockM, kBlockN>(p, tile.m_block);
  if (range.empty()) return;  // every row fully masked (or seqlen_k == 0): O = 0, l = 0 -> LSE = -inf

  const int thread = threadIdx.x % kWarpgroupThreads;
  const bool warp_leader = threadIdx.x % 32 == 0;
  const int64_t row0 = int64_t(tile.m_block) * kBlockM + ptx::accumulator_row(thread, 0);
  const int64_t row[2] = {row0, row0 + 8};
  const int col_base = 2 * (thread % 4);

  const uint32_t q_tile = static_cast<uint32_t>(__cvta_generic_to_shared(smem.q));
  const Ring k_ring(smem.k_ring), v_ring(smem.v_ring);
  ptx::mbarrier_wait_parity(&smem.q_full, 0);

  auto stage = cuda::consumer_start_state<Config::kStages>();
  for (int32_t n_block = range.begin; n_block < range.end; ++n_block, ++stage) {
    ptx::WgmmaAccumulator<kBlockN> s;
    k_ring.consumer_wait(stage);
    gemm_qk<In, HeadDim, kBlockM, kBlockN>(s, q_tile,
                                           static_cast<uint32_t>(__cvta_generic_to_shared(smem.k[stage.index])));
    __syncwarp();
    if (warp_leader) k_ring.consumer_release(stage);

    const bool masked = !kv_tile_fully_visible<kBlockM, kBlockN>(p, tile.m_block, n_block);
    softmax_tile<kBlockN, HeadDim>(p, s, o, rows, row, int64_t(n_block) * kBlockN, col_base, masked);

    ptx::WgmmaFragmentA p_frag[kBlockN / 16];
#pragma unroll
    for (int kb = 0; kb < kBlockN / 16; ++kb) p_frag[kb] = ptx::fragment_a_from_accumulator<In>(s, kb);

    v_ring.consumer_wait(stage);
    gemm_pv<In, HeadDim, kBlockN>(o, p_frag, static_cast<uint32_t>(__cvta_generic_to_shared(smem.v[stage.index])));
    __syncwarp();
    if (warp_leader) v_ring.consumer_release(stage);
  }
}

}  // namespace fa4::sm90
