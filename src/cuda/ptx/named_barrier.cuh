// Named CTA barriers (bar.sync / bar.arrive with an id and a thread count), hand-written because CCCL's
// cuda::ptx has no named-barrier instruction. Id 0 is __syncthreads'; kernels name the others in an enum.
// `threads` counts every thread that takes part (syncers and arrivers together), a multiple of 32; a warp
// takes part as a whole (all its threads execute the instruction, convergent).
#pragma once

#include <cstdint>

namespace fa4::ptx {

inline constexpr uint32_t kNamedBarriers = 16;  // hardware barriers per CTA

// Arrives and waits until `threads` threads have arrived at barrier `id` (this one included).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(threads) : "memory");
}

// The same, for warps that reach the barrier from different instructions (e.g. two template instances of a
// role, one per warpgroup): bar.sync is barrier.sync.aligned, which requires every thread to execute the same
// instruction (compute-sanitizer synccheck reports the aligned form there as divergence).
__device__ __forceinline__ void named_barrier_sync_any_site(uint32_t id, uint32_t threads) {
  asm volatile("barrier.sync %0, %1;" : : "r"(id), "r"(threads) : "memory");
}

// Arrives at barrier `id` without waiting (the producer side of a hand-over).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" : : "r"(id), "r"(threads) : "memory");
}

}  // namespace fa4::ptx
