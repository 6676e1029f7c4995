// Warp-level tensor-core MMA (mma.sync m16n8k16, sm_80+) and ldmatrix, which CCCL's cuda::ptx does not wrap.
// Used where a warpgroup-wide wgmma would waste its 64 rows: the decode kernel's 16-row tiles (sm90/decode.cu).
//
// Fragments of D[16×8] += A[16×16] · B[16×8] (16-bit A/B, fp32 C/D), lane = threadIdx.x % 32, g = lane / 4,
// c = 2 · (lane % 4):
//   A (row-major): a[0] = (row g, cols c, c+1), a[1] = (row g + 8, cols c, c+1), a[2] = (row g, cols c+8, c+9),
//                  a[3] = (row g + 8, cols c+8, c+9); each a 32-bit pair, the lower column in the low half.
//   B (k × n, "col"): b[0] = (k c, c+1; n g), b[1] = (k c+8, c+9; n g).
//   C/D: d[0], d[1] = (row g, cols c, c+1), d[2], d[3] = (row g + 8, cols c, c+1).
#pragma once

#include <cstdint>

#include "cuda/ptx/wgmma.cuh"  // WgmmaInput: the 16-bit input type, as for wgmma

namespace fa4::ptx {

template <WgmmaInput In>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (In == WgmmaInput::bf16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8×8 matrices of 16-bit elements from shared memory, transposed: lane l gives the address of row l % 8 of
// matrix l / 8 (16 contiguous bytes); register i receives matrix i as a B fragment half (k = the matrix's rows,
// n = its columns): r[i] = (rows c, c+1; column g).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address)
               : "memory");
}

}  // namespace fa4::ptx
