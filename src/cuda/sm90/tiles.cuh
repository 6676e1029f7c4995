// Tile primitives both sm_90a passes use: TMA loads of a [rows][head_dim] tile into its 128B-swizzled
// [head_dim/64 chunks][rows][128 B] image, the two GEMM issue patterns on such images, and MUFU exp2.
//   issue_qk: acc = A·Bᵀ, A and B both K-major tiles (forward S = Q·Kᵀ; backward Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ)
//   issue_pv: acc += A·B, A from registers, B an MN-major tile (forward O += P·V; backward dV += Pᵀ·dO and
//             dK += dSᵀ·Q)
#pragma once

#include <cstdint>

#include "cuda/ptx/stmatrix.cuh"
#include "cuda/ptx/swizzle.hpp"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/config.hpp"
#include "cuda/sm90/visibility.hpp"
#include "fa4/fa4.hpp"
#include "numerics/mask.hpp"

namespace fa4::sm90 {

template <DType Dtype>
constexpr ptx::WgmmaInput wgmma_input() {
  static_assert(Dtype == DType::bf16 || Dtype == DType::f16, "the sm90 kernels take bf16 or fp16");
  return Dtype == DType::bf16 ? ptx::WgmmaInput::bf16 : ptx::WgmmaInput::f16;
}

// Opts `kernel` in to `smem` bytes of dynamic shared memory on the current device, once per (kernel, device,
// size) in the process: the attribute persists, and setting it is a driver call on every launch otherwise.
// `again`: set it even if this process did (a cudaDeviceReset forgets it; the launch below retries once).
cudaError_t opt_in_dynamic_smem(const void* kernel, uint32_t smem, bool again = false);

// Launches a kernel that takes its parameters as one __grid_constant__ struct, with `smem` bytes of dynamic
// shared memory (opted in first: above 48 KiB the attribute is required).
// `programmatic`: a programmatic dependent launch (PDL) on the stream's previous kernel: the grid may become
// resident before that kernel has finished, so the kernel must call cudaGridDependencySynchronize before it
// reads or writes global memory (the forward does, first thing).
// `cooperative`: every CTA resident at once, or the launch fails (cudaErrorCooperativeLaunchTooLarge): for grids
// whose CTAs wait for one another (the backward's persistent rotated walk).
template <class Params>
cudaError_t launch_with_dynamic_smem(void (*kernel)(Params), uint32_t grid, uint32_t threads, uint32_t smem,
                                     cudaStream_t stream, const Params& params, uint32_t cluster = 1,
                                     bool programmatic = false, bool cooperative = false) {
  if (const cudaError_t e = opt_in_dynamic_smem(reinterpret_cast<const void*>(kernel), smem); e != cudaSuccess)
    return e;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[3]{};
  config.attrs = attrs;
  if (cluster > 1) {  // consecutive CTAs form a cluster (grid a multiple of `cluster`)
    cudaLaunchAttribute& a = attrs[config.numAttrs++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = cluster, a.val.clusterDim.y = 1, a.val.clusterDim.z = 1;
  }
  if (programmatic) {
    cudaLaunchAttribute& a = attrs[config.numAttrs++];
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    cudaLaunchAttribute& a = attrs[config.numAttrs++];
    a.id = cudaLaunchAttributeCooperative;
    a.val.cooperative = 1;
  }
  cudaError_t e = cudaLaunchKernelEx(&config, kernel, params);
  if (e == cudaErrorInvalidValue && smem > 48 * 1024) {  // the opt-in may have been lost with a reset context
    (void)cudaGetLastError();
    if (opt_in_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, /*again=*/true) == cudaSuccess)
      e = cudaLaunchKernelEx(&config, kernel, params);
  }
  return e;
}

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

// The same tile when only its first `valid` rows (> 0) belong to the tile's sequence (a packed variable-length
// batch): those rows by TMA (whole boxes of `map` while they last, then 16-row boxes of map16 and 1-row boxes
// of map1), the rest as zeros (boxes wholly out of bounds, above row 0), since the rows after a sequence belong
// to the next one or to none. Every box counts its full bytes on full_barrier: the byte count of a whole tile.
template <int HeadDim, int Rows>
__device__ __forceinline__ void load_tile_in_sequence(uint8_t* smem_tile, const CUtensorMap* map,
                                                      const CUtensorMap* map16, const CUtensorMap* map1, int32_t row,
                                                      int32_t valid, int32_t head, int32_t batch,
                                                      uint64_t* full_barrier) {
  if (valid >= Rows) return load_tile<HeadDim, Rows>(smem_tile, map, row, head, batch, full_barrier);
  auto issue = [&](const CUtensorMap* m, int32_t smem_row, int32_t at) {
#pragma unroll
    for (int chunk = 0; chunk < HeadDim / kSw128Columns; ++chunk) {
      const int32_t coords[4] = {chunk * kSw128Columns, at, head, batch};
      ptx::tma_load(smem_tile + (chunk * Rows + smem_row) * ptx::kSw128RowBytes, m, coords, full_barrier);
    }
  };
  static_assert(Rows % 16 == 0, "whole 16-row boxes");
  int32_t r = 0;
#pragma unroll 1  // the producer's code stays small: it shares the instruction cache with the consumers
  for (; r + 16 <= valid; r += 16) issue(map16, r, row + r);
#pragma unroll 1
  for (; r < valid; ++r) issue(map1, r, row + r);
#pragma unroll 1
  for (; r % 16 != 0; ++r) issue(map1, r, -1);
#pragma unroll 1
  for (; r < Rows; r += 16) issue(map16, r, -16);
}

// Issues S = Q·Kᵀ over head_dim / 16 k-steps (one commit group); the caller waits. q_rows: this warpgroup's
// 64 rows inside the Q tile, whose head-dim chunks are q_chunk_bytes apart; K tile [chunks][block_n][128 B]
// (k_chunk_bytes apart when the N = BlockN rows are part of a taller tile).
template <ptx::WgmmaInput In, int HeadDim, int BlockN>
__device__ __forceinline__ void issue_qk(ptx::WgmmaAccumulator<BlockN>& s, uint32_t q_rows, uint32_t q_chunk_bytes,
                                         uint32_t k_tile, uint32_t k_chunk_bytes = uint32_t(BlockN) * 128u) {
  // The descriptors are encoded once and moved per k-step (one add each): encoding per k-step cost ~12
  // instructions per wgmma and delayed the next issue (ncu of the backward, docs/perf-log.md B5).
  const auto a0 = ptx::sw128_k_major_desc(q_rows), b0 = ptx::sw128_k_major_desc(k_tile);
  ptx::wgmma_fence_operand(s);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HeadDim / 16; ++kk) {
    // k-step kk: chunk kk/4, 32 bytes per k-step of 16 elements inside the 128-byte row.
    ptx::wgmma_ss<In, ptx::Major::k, ptx::Major::k>(s, a0.advanced((kk / 4) * q_chunk_bytes + (kk % 4) * 32u),
                                                    b0.advanced((kk / 4) * k_chunk_bytes + (kk % 4) * 32u),
                                                    /*accumulate=*/kk > 0);
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
  const auto v0 = ptx::sw128_mn_major_desc(v_tile, BlockN * 128u);
#pragma unroll
  for (int kb = 0; kb < BlockN / 16; ++kb)
    ptx::wgmma_rs<In, ptx::Major::mn>(o, p[kb], v0.advanced(kb * 2048u), /*accumulate=*/true);
  ptx::wgmma_commit_group();
}

__device__ __forceinline__ float exp2_mufu(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A generic pointer into shared memory as the 32-bit shared-window address PTX takes.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Writes 64 × 16 slices (16-bit A fragments, i.e. the accumulator as wgmma's A operand rounds it) into a
// [cols/64 chunks][TileRows][128 B] 128B-swizzled tile at rows row0.., columns col0..: the backward's Pᵀ and dSᵀ
// (keys are rows, queries the columns), the forward's O staging (epilogue.cuh). One stmatrix.x4 per
// warp and slice: each lane addresses one 16-byte row segment, and the swizzle puts a matrix's 8 rows in 8
// distinct 16-byte bank groups.
template <int TileRows, int K>
__device__ __forceinline__ void store_fragments16(uint8_t* tile, const ptx::WgmmaFragmentA (&frags)[K], int row0,
                                                  int col0) {
  const int thread = threadIdx.x % kWarpgroupThreads, lane = thread % 32;
  const uint32_t row = uint32_t(row0 + 16 * (thread / 32) + ptx::stmatrix_x4_row(lane));
  const uint32_t base = smem_address(tile);
#pragma unroll
  for (int kb = 0; kb < K; ++kb) {
    const uint32_t col = uint32_t(col0 + 16 * kb + ptx::stmatrix_x4_col(lane));
    ptx::stmatrix_x4(base + (col / 64) * uint32_t(TileRows) * ptx::kSw128RowBytes + ptx::sw128_offset(row, col % 64, 2),
                     frags[kb].reg[0], frags[kb].reg[1], frags[kb].reg[2], frags[kb].reg[3]);
  }
}

// The same from a 64 × N accumulator (rounded here).
template <ptx::WgmmaInput In, int N, int TileRows>
__device__ __forceinline__ void store_tile16(uint8_t* tile, const ptx::WgmmaAccumulator<N>& acc, int row0, int col0) {
  static_assert(N % 16 == 0, "whole 16-column slices");
  ptx::WgmmaFragmentA frags[N / 16];
#pragma unroll
  for (int kb = 0; kb < N / 16; ++kb) frags[kb] = ptx::fragment_a_from_accumulator<In>(acc, kb);
  store_fragments16<TileRows>(tile, frags, row0, col0);
}

}  // namespace fa4::sm90
