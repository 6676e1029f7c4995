// Kernel selection: the one place that decides which backend (and, on the GPU, which compiled kernel) runs a
// validated problem, and how much workspace it needs.
#pragma once

#include <cstddef>

#include "api/problem.hpp"

namespace fa4::detail {

enum class Backend { cpu, cuda };

// Throws Error(unsupported) naming the reason when no backend of this build can run the problem (either
// pass). CUDA problems need a row of src/cuda/instances.def for (dtype, head_dim) and a device it was
// compiled for.
Backend require_backend(const char* call, const Problem& p);

// The pass-specific part: throws Error(unsupported) when the selected backend lacks this pass.
void require_pass(const char* call, const Problem& p, Pass pass);

// The layout part: throws Error(unsupported) naming the tensor and stride the selected kernel cannot read
// (the sm_90a kernels load q, k, v with TMA: 16-byte aligned bases and strides).
// k_name, v_name: as validate_inputs's.
void require_layout(const char* call, const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                    const char* k_name = "k", const char* v_name = "v");

// The backward's extra inputs: throws Error(unsupported) when the selected kernel cannot read dout (TMA).
void require_backward_layout(const char* call, const Problem& p, const Tensor& dout);

std::size_t workspace_bytes(const Problem& p, Pass pass);

}  // namespace fa4::detail
