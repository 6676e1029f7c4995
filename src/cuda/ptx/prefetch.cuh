// prefetch.global.L2: a global memory line pulled into L2 ahead of the load that will want it (the cuda::ptx of CUDA
// 13.0's CCCL has no prefetch; later CCCL has cuda::ptx::prefetch_L2). A hint: nothing waits for it, and the memory
// system may drop it.
#pragma once

namespace fa4::ptx {

__device__ __forceinline__ void prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];" : : "l"(__cvta_generic_to_global(ptr)));  // .global takes a global address
}

}  // namespace fa4::ptx
