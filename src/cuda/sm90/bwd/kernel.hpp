// Host view of the compiled sm_90a backward kernels (kernel.cu, pre_post.cu): one launch function each.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/bwd/params.hpp"
#include "fa4/fa4.hpp"

namespace fa4::sm90 {

// The main kernel of the instances.def bwd row (dtype, head_dim): one CTA per work item (p.work_items =
// n_block_slots · heads_kv · batch), or with p.rotated_walk a persistent cooperative grid of whole rounds of
// n_block_slots CTAs (cudaErrorCooperativeLaunchTooLarge when not even one round is resident at once).
// varlen: its variable-length instance (p.cu_seqlens_q/k set; batch = sequences, n_blocks the longest's).
cudaError_t launch_bwd_kernel(DType dtype, int head_dim, const BwdParams& p, bool varlen, cudaStream_t stream);

// D, LSE₂ and the zeroed dQ accumulator for every padded row of every (batch, head) pair.
cudaError_t launch_bwd_preprocess(DType dtype, const BwdPrePostParams& p, int64_t batch, cudaStream_t stream);

// dsinks = -Σ exp(sink - LSE) · D per query head, from the preprocess's LSE₂ and D (p.dsinks non-null); with no
// row (batch or seqlen_q 0, ws.rows_padded 0) it writes zeros.
cudaError_t launch_bwd_sink_gradient(const BwdPrePostParams& p, int64_t batch, cudaStream_t stream);

// A variable-length batch: zeroes the rows of a (and b, when given) [1, rows, heads, head_dim] that no sequence
// covers (cu: device [batch + 1] offsets; used: device [batch] lengths, or null for cu's differences).
cudaError_t launch_bwd_zero_uncovered(const StridedRows& a, const StridedRows* b, int64_t rows, int32_t heads,
                                      int32_t head_dim, const int32_t* cu, const int32_t* used, int32_t batch,
                                      cudaStream_t stream);

// dQ = accumulator · scale in q's dtype and dq's strides.
cudaError_t launch_bwd_postprocess(DType dtype, const BwdPrePostParams& p, int64_t batch, cudaStream_t stream);

}  // namespace fa4::sm90
