// Host view of the compiled sm_90a forward kernels (kernel_fwd.cu): launch one instance of instances.def.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/params.hpp"
#include "fa4/fa4.hpp"

namespace fa4::sm90 {

// Launches the (dtype, head_dim) row on `stream` with `grid` CTAs; cudaErrorInvalidValue if not compiled.
cudaError_t launch_fwd_kernel(DType dtype, int head_dim, const FwdParams& params, uint32_t grid, cudaStream_t stream);

// Query rows per CTA of the head dim's tile-table row (0 if none).
uint32_t fwd_block_m(int head_dim);

}  // namespace fa4::sm90
