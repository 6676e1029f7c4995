// wgmma (sm_90a warpgroup MMA), hand-written because CCCL's cuda::ptx has no wgmma: the fence / commit / wait
// protocol and m64nNk16 fp32 += bf16|fp16 × bf16|fp16, with A from shared memory (SS) or registers (RS).
// The per-N inline asm is generated (gen_wgmma_shapes.py → wgmma_shapes.inc); this file is the typed interface.
//
// Issue protocol for one GEMM (reference/fa3.md §3.4):
//   wgmma_fence_operand(acc);  wgmma_fence();          // registers written since the last wgmma are ready
//   for each k-step: wgmma_ss / wgmma_rs(acc, ...);     // same accumulator, back to back
//   wgmma_commit_group();  ...  wgmma_wait_group<n>();  // before reading acc or overwriting an RS A fragment
//   wgmma_fence_operand(acc);
// All 128 threads of the warpgroup execute every call (.sync.aligned), convergent, with identical descriptors.
#pragma once

#include <cstdint>

#include "cuda/ptx/wgmma_desc.hpp"
#include "cuda/ptx/wgmma_fragment.hpp"
#include "cuda/ptx/wgmma_shapes.inc"

// wgmma exists only on sm_90a; other device targets of a multi-arch build get a trap (never a silent no-op).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA4_HAS_WGMMA 1
#endif

namespace fa4::ptx {

enum class WgmmaInput { bf16, f16 };       // element type of A and B (part of the opcode)
enum class Major : int { k = 0, mn = 1 };  // values are the instruction's transpose immediates

namespace detail {
constexpr bool wgmma_shape_generated(int n) {
  for (int s : kWgmmaShapesN)
    if (s == n) return true;
  return false;
}
}  // namespace detail

// A warpgroup's 64×N fp32 accumulator: N/2 registers per thread, laid out per wgmma_fragment.hpp.
template <int N>
struct WgmmaAccumulator {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma N is a multiple of 8 in [8, 256]");
  static_assert(detail::wgmma_shape_generated(N), "this N is not generated: add it to gen_wgmma_shapes.py");
  static constexpr int kN = N;
  static constexpr int kRegs = N / 2;
  float reg[N / 2];
};

// A 64×16 16-bit A operand in registers (RS form): 4 × b32 per thread, laid out per wgmma_fragment.hpp.
struct WgmmaFragmentA {
  uint32_t reg[4];
};

// Makes register writes by ordinary instructions (accumulator init/rescale, A fragment packing) visible to the
// following wgmma; required before the first wgmma of a GEMM and after any such write.
__device__ __forceinline__ void wgmma_fence() {
#if defined(FA4_HAS_WGMMA)
  asm volatile("wgmma.fence.sync.aligned;\n" : : : "memory");
#else
  __trap();
#endif
}

// Closes the wgmmas issued since the last commit into one group.
__device__ __forceinline__ void wgmma_commit_group() {
#if defined(FA4_HAS_WGMMA)
  asm volatile("wgmma.commit_group.sync.aligned;\n" : : : "memory");
#else
  __trap();
#endif
}

// Waits until at most `Pending` committed groups are in flight (an immediate of the instruction).
template <int Pending>
__device__ __forceinline__ void wgmma_wait_group() {
  static_assert(Pending >= 0 && Pending <= 7, "wgmma.wait_group takes an immediate in [0, 7]");
#if defined(FA4_HAS_WGMMA)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" : : "n"(Pending) : "memory");
#else
  __trap();
#endif
}

// Compiler-only ordering: the asm "reads and writes" every register, so the compiler neither moves accumulator
// arithmetic across a wgmma issue/wait nor keeps stale copies. Emits no instruction.
template <int N>
__device__ __forceinline__ void wgmma_fence_operand(WgmmaAccumulator<N>& acc) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(acc.reg[i])::"memory");
}
__device__ __forceinline__ void wgmma_fence_operand(WgmmaFragmentA& a) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a.reg[i])::"memory");
}

// acc (+)= A·B for one k-step of 16, both operands in shared memory. `accumulate` false overwrites acc (the first
// k-step of a fresh GEMM), true adds. Both 16-bit operands may be K- or MN-major.
template <WgmmaInput In, Major MajorA, Major MajorB, int N>
__device__ __forceinline__ void wgmma_ss(WgmmaAccumulator<N>& acc, WgmmaDesc a, WgmmaDesc b, bool accumulate) {
#if defined(FA4_HAS_WGMMA)
  if constexpr (In == WgmmaInput::bf16)
    detail::wgmma_m64k16_ss_bf16<static_cast<int>(MajorA), static_cast<int>(MajorB)>(acc.reg, a.bits, b.bits,
                                                                                     accumulate ? 1u : 0u);
  else
    detail::wgmma_m64k16_ss_f16<static_cast<int>(MajorA), static_cast<int>(MajorB)>(acc.reg, a.bits, b.bits,
                                                                                    accumulate ? 1u : 0u);
#else
  __trap();
#endif
}

// acc (+)= A·B for one k-step of 16, A from registers (always K-major), B in shared memory. The A registers must
// not be overwritten until a wgmma_wait_group shows this wgmma's group complete.
template <WgmmaInput In, Major MajorB, int N>
__device__ __forceinline__ void wgmma_rs(WgmmaAccumulator<N>& acc, const WgmmaFragmentA& a, WgmmaDesc b,
                                         bool accumulate) {
#if defined(FA4_HAS_WGMMA)
  if constexpr (In == WgmmaInput::bf16)
    detail::wgmma_m64k16_rs_bf16<static_cast<int>(MajorB)>(acc.reg, a.reg, b.bits, accumulate ? 1u : 0u);
  else
    detail::wgmma_m64k16_rs_f16<static_cast<int>(MajorB)>(acc.reg, a.reg, b.bits, accumulate ? 1u : 0u);
#else
  __trap();
#endif
}

// Packs two fp32 values (round to nearest even) into one b32: `lo` in bits 0-15. PTX's cvt.rn.{bf16,f16}x2.f32
// puts its FIRST source in the upper half, hence the operand order.
template <WgmmaInput In>
__device__ __forceinline__ uint32_t pack_rn(float lo, float hi) {
  uint32_t packed;
  if constexpr (In == WgmmaInput::bf16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}

// The A fragment of k-block `k_block` (columns 16·k_block .. +15) of a 64×N accumulator, rounded to 16 bits: a
// re-indexing of this thread's own registers, no data exchange (P = softmax(S) feeding O += P·V).
template <WgmmaInput In, int N>
__device__ __forceinline__ WgmmaFragmentA fragment_a_from_accumulator(const WgmmaAccumulator<N>& acc, int k_block) {
  static_assert(N % 16 == 0, "the accumulator must split into whole 16-column k-blocks");
  WgmmaFragmentA a;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    a.reg[j] =
        pack_rn<In>(acc.reg[fragment_a_source_reg(k_block, j, 0)], acc.reg[fragment_a_source_reg(k_block, j, 1)]);
  return a;
}

}  // namespace fa4::ptx
