// stmatrix (sm_90): a warp stores four 8×8 matrices of 16-bit elements to shared memory in one instruction.
// Not in CCCL's cuda::ptx (CUDA 13.0), hence this wrapper. Lane l gives the address of row l % 8 of matrix l / 8
// (16 contiguous bytes); register i holds this lane's element pair of matrix i: row l / 4, columns 2·(l % 4) and
// + 1 (lower half = even column). That is the wgmma accumulator's (and A fragment's) layout of a warp's 16 rows,
// so a packed 64×16 A fragment is one stmatrix.x4 per warp: registers (rows 0-7, cols 0-7), (rows 8-15,
// cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15).
#pragma once

#include <cstdint>

namespace fa4::ptx {

__device__ __forceinline__ void stmatrix_x4(uint32_t smem_address, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               :
               : "r"(smem_address), "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#else
  __trap();
#endif
}

// The row this lane addresses in an x4 store of a warp's 16-row × 16-column slice, and its column offset (0 or
// 8), in the matrix order of the A fragment above.
__device__ __forceinline__ int stmatrix_x4_row(int lane) { return lane % 8 + 8 * ((lane / 8) % 2); }
__device__ __forceinline__ int stmatrix_x4_col(int lane) { return 8 * (lane / 16); }

}  // namespace fa4::ptx
