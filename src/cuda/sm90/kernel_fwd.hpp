// Host view of the compiled sm_90a forward kernels (kernel_fwd.cu): launch one instance of instances.def.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/params.hpp"
#include "fa4/fa4.hpp"

namespace fa4::sm90 {

// Launches the kernel of (dtype, kFwdTiles row `row`, whose head dim is head_dim) on `stream` with `grid` CTAs in
// clusters of `cluster` consecutive CTAs (grid a multiple of it; above 8 the kernel is opted in to non-portable
// sizes), the instance with per-sequence geometry when `varlen` (a variable-length batch, params.cu_seqlens_*, or
// a KV-cache call); cudaErrorInvalidValue if that (dtype, head_dim) is not compiled or the row is not one of the
// head dim's.
cudaError_t launch_fwd_kernel(DType dtype, int head_dim, int row, bool varlen, const FwdParams& params, uint32_t grid,
                              uint32_t cluster, cudaStream_t stream);

// How many clusters of `cluster` CTAs of that kernel the current device runs at once (its shared memory allows one
// CTA per SM, so a cluster needs that many free SMs in one GPC); asked once per (kernel, size, device) in the
// process. A size the device refuses gives 0.
cudaError_t fwd_max_active_clusters(DType dtype, int head_dim, int row, bool varlen, uint32_t cluster, int* clusters);

}  // namespace fa4::sm90
