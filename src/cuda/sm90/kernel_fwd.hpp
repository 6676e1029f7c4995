// Host view of the compiled sm_90a forward kernels (kernel_fwd.cu): launch one instance of instances.def.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/params.hpp"
#include "fa4/fa4.hpp"

namespace fa4::sm90 {

// Launches the kernel of (dtype, kFwdTiles row `row`, whose head dim is head_dim) on `stream` with `grid` CTAs,
// the instance with per-sequence geometry when `varlen` (a variable-length batch, params.cu_seqlens_*, or a
// KV-cache call); cudaErrorInvalidValue if that (dtype, head_dim) is not compiled or the row is not one of the
// head dim's.
cudaError_t launch_fwd_kernel(DType dtype, int head_dim, int row, bool varlen, const FwdParams& params, uint32_t grid,
                              cudaStream_t stream);

}  // namespace fa4::sm90
