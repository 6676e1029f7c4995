// Fences between the generic proxy (ordinary loads/stores) and the async proxy (TMA, wgmma operand reads), and
// the fence that publishes mbarrier initialisation (through CCCL's cuda::ptx).
#pragma once

#include <cuda/ptx>

namespace fa4::ptx {

// After mbarrier_init by one thread, before the CTA barrier: makes the initialised barriers visible to the async
// proxy (TMA complete_tx) and to the other CTAs of a cluster.
__device__ __forceinline__ void fence_barrier_init() {
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
}

// Orders this thread's generic-proxy shared-memory accesses with later async-proxy accesses: needed after plain
// st.shared / stmatrix writes that a wgmma or a TMA store will read, and after generic writes that a later TMA
// load will overwrite. Each writing thread fences, then the threads synchronise.
__device__ __forceinline__ void fence_proxy_async_shared_cta() {
  ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);
}

// The same for global memory: orders async-proxy writes this thread waited for (a bulk reduce-add after
// tma_store_wait) with its later generic-proxy operations, e.g. a release that tells another CTA to go on.
__device__ __forceinline__ void fence_proxy_async_global() {
  ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_global);
}

}  // namespace fa4::ptx
