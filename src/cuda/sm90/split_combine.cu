// Split-KV's second launch: merges the forward's per-range partials into out and lse, one warp per query row
// (merge_split_row, split_combine.cuh). The forward merges them itself when a tile's ranges run as one cluster
// (FwdParams::cluster_combine); this kernel covers the rest (more ranges than a cluster holds, or tiles than SMs).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/split_combine.cuh"

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
  merge_split_row<Bf16>(p, row, threadIdx.x % 32);
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
