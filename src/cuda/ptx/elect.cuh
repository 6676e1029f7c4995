// Warp-level choices: elect.sync, one lane of the warp (the same one for all lanes) chosen without a shuffle or a
// lane-id test, so that exactly one thread issues TMA / arms barriers while the warp stays converged; and a value
// made warp-uniform.
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

// Lane 0's value, broadcast: the compiler then knows it is the same in every lane and keeps what derives from it
// (a warpgroup's index, the shared-memory descriptors built from it) in uniform registers, where wgmma reads its
// descriptors, instead of copying vector registers over (R2UR) before every wgmma. FA3's warp-group index is
// read the same way. All 32 lanes must call it.
__device__ __forceinline__ int warp_uniform(int value) { return __shfl_sync(0xffffffffu, value, 0); }

}  // namespace fa4::ptx
