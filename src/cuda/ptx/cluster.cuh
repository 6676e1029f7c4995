// Thread-block clusters (sm_90): the CTA's rank, a peer CTA's shared memory, cluster-wide barriers, remote
// mbarrier arrivals, TMA multicast and shared-to-peer bulk copies (all through CCCL's cuda::ptx and the CUDA
// runtime's cluster intrinsics). The backward's CTA pair (bwd/, docs/sm90-backward.md) is the user.
#pragma once

#include <cuda.h>  // CUtensorMap (type only)
#include <cuda_runtime.h>

#include <cstdint>
#include <cuda/ptx>

#include "cuda/ptx/mbarrier.cuh"

namespace fa4::ptx {

// This CTA's rank inside its cluster (0 .. cluster size - 1).
__device__ __forceinline__ uint32_t cluster_ctarank() { return __clusterRelativeBlockRank(); }

// The same shared-memory object in the cluster's CTA `rank` (a generic address the cluster ops below take).
template <class T>
__device__ __forceinline__ T* peer_shared(T* local, uint32_t rank) {
  return static_cast<T*>(__cluster_map_shared_rank(static_cast<void*>(local), rank));
}

// Every thread of every CTA of the cluster: this thread's earlier memory operations are visible to the cluster
// (release) before anyone passes, and the cluster's are to this thread (acquire) after. Not .aligned: threads of
// a warp may arrive at different points (a role's elected lane, its idle lanes).
__device__ __forceinline__ void cluster_sync() {
  ::cuda::ptx::barrier_cluster_arrive(::cuda::ptx::sem_release);
  ::cuda::ptx::barrier_cluster_wait(::cuda::ptx::sem_acquire);
}

// One arrival on an mbarrier in a peer CTA's shared memory (address from peer_shared), releasing this thread's
// earlier memory operations at cluster scope.
__device__ __forceinline__ void mbarrier_arrive_peer(uint64_t* peer_bar) {
  ::cuda::ptx::mbarrier_arrive(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster, ::cuda::ptx::space_cluster,
                               peer_bar);
}

// The same arrival without a release, for a thread whose reads of what the peer will overwrite are complete (a
// wgmma wait) and which wrote nothing the peer reads: the cluster-scope release above compiles to MEMBAR.ALL.GPU
// before the arrive (perf-log F26: the forward's K/V pair ran at 0.65x of one CTA with it, 0.91-0.94x without;
// B25: the backward pair's Q/dO releases relaxed, +14-22% in the multicast mode).
__device__ __forceinline__ void mbarrier_arrive_peer_relaxed(uint64_t* peer_bar) {
  ::cuda::ptx::mbarrier_arrive(::cuda::ptx::sem_relaxed, ::cuda::ptx::scope_cluster, ::cuda::ptx::space_cluster,
                               peer_bar);
}

// Blocks until the phase with this parity of a barrier in this CTA's shared memory has completed, acquiring at
// cluster scope what a peer released with mbarrier_arrive_peer (the CTA-scope wait of mbarrier.cuh is what
// CUTLASS uses and works in practice; the memory model asks for this one). Traps after FA4_MBARRIER_TIMEOUT_NS
// like mbarrier_wait_parity.
__device__ __forceinline__ void mbarrier_wait_parity_cluster(uint64_t* bar, uint32_t parity) {
  poll_until([&] {
    return ::cuda::ptx::mbarrier_try_wait_parity(::cuda::ptx::sem_acquire, ::cuda::ptx::scope_cluster, bar, parity);
  });
}

// A TMA tile load whose box lands at the same shared-memory offset in every CTA of cta_mask, each CTA's
// mbarrier at `bar`'s offset receiving the box's bytes as complete_tx (tma_load's coordinate contract).
template <int Rank>
__device__ __forceinline__ void tma_load_multicast(void* smem_dst, const CUtensorMap* map,
                                                   const int32_t (&coords)[Rank], uint64_t* bar, uint16_t cta_mask) {
  static_assert(Rank >= 1 && Rank <= 5, "TMA tensors have 1 to 5 dimensions");
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem_dst, map, coords,
                                    bar, cta_mask);
}

// `bytes` (a multiple of 16) from this CTA's shared memory into a peer's (peer_dst from peer_shared), completing
// as transaction bytes on the peer's mbarrier peer_bar. The source may be reused once the peer says it landed.
__device__ __forceinline__ void bulk_copy_to_peer(void* peer_dst, const void* smem_src, uint32_t bytes,
                                                  uint64_t* peer_bar) {
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_shared, peer_dst, smem_src, bytes,
                             peer_bar);
}

}  // namespace fa4::ptx
