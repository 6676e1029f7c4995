// elect.sync: one lane of the warp (the same one for all lanes) is chosen, without a shuffle or a lane-id test.
// Used so that exactly one thread issues TMA / arms barriers while the warp stays converged.
#pragma once

#include <cstdint>

namespace fa4::ptx {

// All 32 lanes must call it (membermask = full warp); returns true in exactly one of them.
__device__ __forceinline__ bool elect_one_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t elected = 0;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "elect.sync _|p, 0xffffffff;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(elected));
  return elected != 0;
#else
  return false;
#endif
}

}  // namespace fa4::ptx
