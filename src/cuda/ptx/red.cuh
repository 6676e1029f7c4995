// Vector reductions to global memory that CCCL's cuda::ptx does not wrap (it has red.async to shared::cluster
// only): red.global.add.v4.f32 (sm_90), four fp32 adds to 16 aligned contiguous bytes in one instruction,
// performed at L2 (relaxed, gpu scope). The column-split backward adds its dQ slab this way from registers.
#pragma once

namespace fa4::ptx {

__device__ __forceinline__ void red_global_add_v4(float* address, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(address), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
#else
  __trap();
#endif
}

// x + 0 with subnormals flushed (add.ftz.f32): what a reduce-add into a zeroed float leaves (the .f32 reductions
// flush subnormal inputs and results; -0 becomes +0), for a value stored in place of that first add.
__device__ __forceinline__ float flushed_plus_zero(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("add.ftz.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
  return y;
#else
  return x + 0.0f;
#endif
}

// The plain store of the same four floats (16-byte aligned address): the first adder of a deterministic chain.
__device__ __forceinline__ void st_global_v4(float* address, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(address) = make_float4(a, b, c, d);
}

}  // namespace fa4::ptx
