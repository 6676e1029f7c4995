// Tile primitives both sm_90a passes use: TMA loads of a [rows][head_dim] tile into its 128B-swizzled
// [head_dim/64 chunks][rows][128 B] image, the two GEMM issue patterns on such images, and MUFU exp2.
//   issue_qk: acc = A·Bᵀ, A and B both K-major tiles (forward S = Q·Kᵀ; backward Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ)
//   issue_pv: acc += A·B, A from registers, B an MN-major tile (forward O += P·V; backward dV += Pᵀ·dO and
//             dK += dSᵀ·Q)
#pragma once

#include <cstdint>

#include "cuda/ptx/swizzle.hpp"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/config.hpp"

namespace fa4::sm90 {

// Accumulator register i of a thread: row half (i/2)%2 (row r or r + 8), column 8·(i/4) + 2c + i%2.
__device__ __forceinline__ constexpr int reg_row_half(int i) { return (i >> 1) & 1; }
__device__ __forceinline__ constexpr int reg_col_in_pair_block(int i) { return 8 * (i >> 2) + (i & 1); }

// Issues the head_dim / 64 boxes of one [rows][head_dim] tile, each into its 128-byte-wide smem chunk.
template <int HeadDim, int Rows>
__device__ __forceinline__ void load_tile(uint8_t* smem_tile, const CUtensorMap* map, int32_t row, int32_t head,
                                          int32_t batch, uint64_t* full_barrier) {
#pragma unroll
  for (int chunk = 0; chunk < HeadDim / kSw128Columns; ++chunk) {
    const int32_t coords[4] = {chunk * kSw128Columns, row, head, batch};
    ptx::tma_load(smem_tile + chunk * Rows * ptx::kSw128RowBytes, map, coords, full_barrier);
  }
}

// Issues S = Q·Kᵀ over head_dim / 16 k-steps (one commit group); the caller waits. q_rows: this warpgroup's
// 64 rows inside the Q tile, whose head-dim chunks are q_chunk_bytes apart; K tile [chunks][block_n][128 B].
template <ptx::WgmmaInput In, int HeadDim, int BlockN>
__device__ __forceinline__ void issue_qk(ptx::WgmmaAccumulator<BlockN>& s, uint32_t q_rows, uint32_t q_chunk_bytes,
                                         uint32_t k_tile) {
  ptx::wgmma_fence_operand(s);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HeadDim / 16; ++kk) {
    // k-step kk: chunk kk/4, 32 bytes per k-step of 16 elements inside the 128-byte row.
    const auto a = ptx::sw128_k_major_desc(q_rows + (kk / 4) * q_chunk_bytes + (kk % 4) * 32u);
    const auto b = ptx::sw128_k_major_desc(k_tile + (kk / 4) * uint32_t(BlockN) * 128u + (kk % 4) * 32u);
    ptx::wgmma_ss<In, ptx::Major::k, ptx::Major::k>(s, a, b, /*accumulate=*/kk > 0);
  }
  ptx::wgmma_commit_group();
}

// Issues O += P·V over block_n / 16 k-steps (one commit group); V tile [head_dim/64 chunks][block_n rows][128 B]
// read MN-major: a k-step of 16 key rows is 2048 bytes, the 64-wide head-dim chunks are block_n·128 bytes apart
// (LBO). P's registers must stay untouched until the group completes.
template <ptx::WgmmaInput In, int HeadDim, int BlockN>
__device__ __forceinline__ void issue_pv(ptx::WgmmaAccumulator<HeadDim>& o, ptx::WgmmaFragmentA (&p)[BlockN / 16],
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
}

__device__ __forceinline__ float exp2_mufu(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fa4::sm90
