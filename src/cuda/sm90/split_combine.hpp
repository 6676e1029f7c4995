// Host view of split-KV's combine kernel (split_combine.cu): the partials of the forward's key ranges merged into
// out and lse. Launched by launch.cu after the forward kernel, on the same stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fa4/fa4.hpp"

namespace fa4::sm90 {

struct SplitCombineParams {
  // [num_splits][batch][heads_q][seqlen_q] rows: O (× head_dim floats) and LSE, as the forward's epilogue wrote them.
  const float* o_partial = nullptr;
  const float* lse_partial = nullptr;
  int32_t num_splits = 1;
  int32_t batch = 0, heads_q = 0, seqlen_q = 0, head_dim = 0;
  // out [batch, seqlen_q, heads_q, head_dim] (bf16 or fp16, element strides); lse [batch, heads_q, seqlen_q] or null.
  void* out = nullptr;
  int64_t out_stride_b = 0, out_stride_s = 0, out_stride_h = 0;
  bool out_pairs_aligned = true;
  float* lse = nullptr;
  int64_t lse_stride_b = 0, lse_stride_h = 0, lse_stride_s = 0;
  const float* sinks = nullptr;  // fp32 [heads_q] or null
  int64_t sinks_stride = 0;
};

cudaError_t launch_split_combine(DType dtype, const SplitCombineParams& p, cudaStream_t stream);

}  // namespace fa4::sm90
