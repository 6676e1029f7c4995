// prefetch.global.L2: a global memory line pulled into L2 ahead of the load that will want it (CCCL's cuda::ptx has
// no prefetch instruction). A hint: nothing waits for it, and the memory system may drop it.
#pragma once

namespace fa4::ptx {

__device__ __forceinline__ void prefetch_l2(const void* ptr) { asm volatile("prefetch.global.L2 [%0];" : : "l"(ptr)); }

}  // namespace fa4::ptx
