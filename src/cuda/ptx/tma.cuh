// TMA (cp.async.bulk.tensor) tile loads and stores between global memory and this CTA's shared memory, 1D..5D,
// and the bulk-group commit/wait that retires stores (through CCCL's cuda::ptx); prefetch.tensormap is
// hand-written because CCCL lacks it. Tensor maps are built on the host by src/cuda/tensormap.hpp.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; nothing here calls the driver)

#include <cstdint>
#include <cuda/ptx>

namespace fa4::ptx {

// Coordinates are in elements, innermost dimension first. fa4's contract: every coordinate is >= 0 and the
// innermost one is a multiple of 16 bytes (the kernels use multiples of 64 elements); a box may run past the
// tensor's END in any dimension, and those elements arrive as zeros (PTX ISA 5.5.3.3, "Out of Boundary Access").
// Completion is signalled as transaction bytes on `bar` (arm it with mbarrier_arrive_expect_tx) and counts the
// FULL box, zero-filled part included -- as FA3 does, arming every load, tails included, with the whole tile's
// bytes (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp, TmaTransactionBytesQ/K/V); the GPU tests check it.
// Negative starts are not used: the PTX ISA types the coordinates .s32, but an H200 run (driver 580) of a 2D
// SW128 load + store at (-8, -5) raised cudaErrorIllegalInstruction at once (device-check run 6).
// `smem_dst` must be aligned for the map's swizzle (1024 bytes for 128B).
// Rank is a template parameter because the instruction's dimensionality is part of the opcode.
template <int Rank>
__device__ __forceinline__ void tma_load(void* smem_dst, const CUtensorMap* map, const int32_t (&coords)[Rank],
                                         uint64_t* bar) {
  static_assert(Rank >= 1 && Rank <= 5, "TMA tensors have 1 to 5 dimensions");
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_shared, ::cuda::ptx::space_global, smem_dst, map, coords, bar);
}

// Writes the box from shared memory; elements past the tensor's end are not written (coordinates as for
// tma_load: non-negative, innermost 16-byte aligned). The source must have been
// made visible to the async proxy (fence_proxy_async_shared_cta + a barrier) before this is issued.
template <int Rank>
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const int32_t (&coords)[Rank], const void* smem_src) {
  static_assert(Rank >= 1 && Rank <= 5, "TMA tensors have 1 to 5 dimensions");
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_global, ::cuda::ptx::space_shared, map, coords, smem_src);
}

// Closes the group of stores issued so far by this thread.
__device__ __forceinline__ void tma_store_commit() { ::cuda::ptx::cp_async_bulk_commit_group(); }

// Waits until at most `Pending` committed store groups still read their shared-memory source (the buffer may be
// reused); the global writes may still be in flight. Pending is an immediate of the instruction.
template <int Pending>
__device__ __forceinline__ void tma_store_wait_read() {
  static_assert(Pending >= 0 && Pending <= 63, "bulk wait_group takes a small immediate");
  ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<Pending>{});
}

// Waits until at most `Pending` committed store groups are incomplete, global writes included.
template <int Pending>
__device__ __forceinline__ void tma_store_wait() {
  static_assert(Pending >= 0 && Pending <= 63, "bulk wait_group takes a small immediate");
  ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<Pending>{});
}

// Non-tensor bulk copies (cp.async.bulk, 1D): `bytes` contiguous bytes, a multiple of 16, both addresses
// 16-byte aligned. bulk_load completes as transaction bytes on `bar`, like tma_load.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem_dst, gmem_src, bytes, bar);
}

// gmem_dst[i] += smem_src[i] for bytes / 4 floats, atomically per element (cp.reduce.async.bulk .add.f32), in
// the bulk group of this thread (tma_store_commit / tma_store_wait_read retire it like a store). The source must
// have been made visible to the async proxy first (fence_proxy_async_shared_cta + a barrier).
__device__ __forceinline__ void bulk_reduce_add(float* gmem_dst, const float* smem_src, uint32_t bytes) {
  ::cuda::ptx::cp_reduce_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared, ::cuda::ptx::op_add,
                                    gmem_dst, smem_src, bytes);
}

// gmem_dst[i] = smem_src[i] for bytes / 4 floats (cp.async.bulk.global.shared::cta.bulk_group), in the bulk
// group of this thread, retired like bulk_reduce_add's.
__device__ __forceinline__ void bulk_store(float* gmem_dst, const float* smem_src, uint32_t bytes) {
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared, gmem_dst, smem_src, bytes);
}

// Pulls the descriptor into the TMA unit's cache ahead of the first copy (one thread, at kernel start).
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];" : : "l"(map) : "memory");
#endif
}

}  // namespace fa4::ptx
