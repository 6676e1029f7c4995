// setmaxnreg: a warpgroup gives registers back to the CTA's pool (producer roles) or takes more from it (MMA /
// softmax roles) after launch. Warpgroup-wide: all four warps of the warpgroup execute the same instruction.
//
// The pool is what the kernel was launched with: use __launch_bounds__(threads, 1) so ptxas sizes every thread
// at 65536 / threads (rounded down to 8), and keep  sum over warpgroups of 128 · registers  <= 65536, or an
// increase waits for registers that never come.
#pragma once

namespace fa4::ptx {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_FEAT_SM100_ALL)
#define FA4_HAS_SETMAXNREG 1
#endif

// Registers is an immediate of the instruction.
template <int Registers>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(Registers % 8 == 0 && Registers >= 24 && Registers <= 256,
                "setmaxnreg takes a multiple of 8 in [24, 256]");
#if defined(FA4_HAS_SETMAXNREG)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" : : "n"(Registers));
#endif
}

template <int Registers>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(Registers % 8 == 0 && Registers >= 24 && Registers <= 256,
                "setmaxnreg takes a multiple of 8 in [24, 256]");
#if defined(FA4_HAS_SETMAXNREG)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" : : "n"(Registers));
#endif
}

}  // namespace fa4::ptx
