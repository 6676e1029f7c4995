// Split-KV's second launch: merges the forward's per-range partials (fp32 O normalised over its range, and its
// LSE; params.hpp) into out and lse with the LSE rule of numerics/split_merge.hpp, the attention sink joining the
// denominator once, here. One warp per query row: every lane merges the row's num_splits LSEs (a few loads, the
// same on every lane), then sums its columns of the weighted O_s, two at a time, and stores them rounded to
// out's dtype at out's strides.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/split_combine.hpp"
#include "numerics/convert.hpp"
#include "numerics/split_merge.hpp"

namespace fa4::sm90 {
namespace {

constexpr int kWarpsPerCta = 4;

template <bool Bf16>
__global__ void __launch_bounds__(32 * kWarpsPerCta) split_combine(const SplitCombineParams p) {
  // Launched as a programmatic dependent of the forward: everything before this line overlaps its tail.
  cudaGridDependencySynchronize();
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = row % p.seqlen_q, h = row / p.seqlen_q % p.heads_q, b = row / (int64_t(p.seqlen_q) * p.heads_q);

  num::LseMerge<float> merge;
  for (int s = 0; s < p.num_splits; ++s) merge.add(p.lse_partial[s * rows + row]);
  if (p.sinks != nullptr) merge.add(p.sinks[h * p.sinks_stride]);
  merge.finish();
  if (p.lse != nullptr && lane == 0) p.lse[b * p.lse_stride_b + h * p.lse_stride_h + i * p.lse_stride_s] = merge.lse;

  uint16_t* const out = static_cast<uint16_t*>(p.out) + b * p.out_stride_b + i * p.out_stride_s + h * p.out_stride_h;
  for (int col = 2 * lane; col < p.head_dim; col += 64) {
    float2 acc = make_float2(0.0f, 0.0f);
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = merge.weight(p.lse_partial[s * rows + row]);
      if (w == 0.0f) continue;
      const float2 o = *reinterpret_cast<const float2*>(p.o_partial + (s * rows + row) * p.head_dim + col);
      acc.x = fmaf(w, o.x, acc.x);
      acc.y = fmaf(w, o.y, acc.y);
    }
    const uint16_t lo = Bf16 ? num::float_to_bf16_bits(acc.x) : num::float_to_f16_bits(acc.x);
    const uint16_t hi = Bf16 ? num::float_to_bf16_bits(acc.y) : num::float_to_f16_bits(acc.y);
    if (p.out_pairs_aligned) {
      *reinterpret_cast<uint32_t*>(out + col) = uint32_t(lo) | (uint32_t(hi) << 16);
    } else {
      out[col] = lo;
      out[col + 1] = hi;
    }
  }
}

}  // namespace

cudaError_t launch_split_combine(DType dtype, const SplitCombineParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  if (rows == 0) return cudaSuccess;
  // A programmatic dependent launch (PDL): the grid may be scheduled once every forward CTA has triggered (at
  // its start), and cudaGridDependencySynchronize orders its reads after the whole forward grid. Stream order
  // and CUDA-graph capture (a programmatic edge) are kept.
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(uint32_t((rows + kWarpsPerCta - 1) / kWarpsPerCta));
  config.blockDim = dim3(32 * kWarpsPerCta);
  config.stream = stream;
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &pdl;
  config.numAttrs = 1;
  return dtype == DType::bf16 ? cudaLaunchKernelEx(&config, split_combine<true>, p)
                              : cudaLaunchKernelEx(&config, split_combine<false>, p);
}

}  // namespace fa4::sm90
