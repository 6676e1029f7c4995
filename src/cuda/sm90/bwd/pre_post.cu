// The backward's preprocess and postprocess kernels (plain CUDA, no tensor cores), one CTA per 64 query rows of
// one (batch, query head) pair, rows padded to the main kernel's block_m:
//   preprocess:  D = rowsum(dO ∘ O) in fp32, LSE₂ = LSE·log2e (+inf where LSE = -inf and for padding rows, so
//                the main kernel's P is 0 there), the pair's dQ accumulator rows and dQ turn counters zeroed;
//                one launch.
//   postprocess: dQ = accumulator · scale, rounded to q's dtype, stored at dq's strides (rows < seqlen_q).
// O, dO and dQ are read/written element-pairwise at any strides (head_dim contiguous).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/bwd/config.hpp"
#include "cuda/sm90/bwd/kernel.hpp"
#include "numerics/convert.hpp"
#include "numerics/online_softmax.hpp"

namespace fa4::sm90 {
namespace {

constexpr int kPreThreads = 256, kPostThreads = kWarpgroupThreads;  // post: one thread per accumulator owner
constexpr int kRowsPerCta = kDqUnitRows;

struct RowChunk {
  int64_t pair, batch, head, chunk, chunks;
};
__device__ __forceinline__ RowChunk row_chunk(const BwdPrePostParams& p) {
  RowChunk c;
  c.chunks = p.ws.rows_padded / kRowsPerCta;
  c.chunk = int64_t(blockIdx.x) % c.chunks;
  c.pair = int64_t(blockIdx.x) / c.chunks;
  c.head = c.pair % p.heads_q;
  c.batch = c.pair / p.heads_q;
  return c;
}

template <bool Bf16>
__device__ __forceinline__ float2 load_pair(const StridedRows& t, int64_t b, int64_t s, int64_t h, int col) {
  const uint16_t* src = static_cast<const uint16_t*>(t.data) + b * t.stride_b + s * t.stride_s + h * t.stride_h + col;
  uint16_t lo, hi;
  if (t.pairs_aligned) {
    const uint32_t v = *reinterpret_cast<const uint32_t*>(src);
    lo = uint16_t(v & 0xffffu), hi = uint16_t(v >> 16);
  } else {
    lo = src[0], hi = src[1];
  }
  if constexpr (Bf16) return make_float2(num::bf16_bits_to_float(lo), num::bf16_bits_to_float(hi));
  else return make_float2(num::f16_bits_to_float(lo), num::f16_bits_to_float(hi));
}

template <bool Bf16>
__global__ void __launch_bounds__(kPreThreads) bwd_preprocess(const BwdPrePostParams p) {
  const RowChunk c = row_chunk(p);
  float4* accum = reinterpret_cast<float4*>(p.ws.dq_accum + (c.pair * c.chunks + c.chunk) * (p.head_dim / kDqUnitCols) *
                                                                int64_t(kDqUnitFloats));
  for (int i = threadIdx.x; i < kRowsPerCta * p.head_dim / 4; i += kPreThreads) accum[i] = make_float4(0, 0, 0, 0);
  // The first row chunk of each main-kernel query tile zeroes the tile's deterministic-mode turn counters.
  const int64_t rows = c.chunk * kRowsPerCta;
  if (rows % p.block_m == 0 && threadIdx.x < p.turns_per_tile)
    p.ws.dq_turn[(c.pair * (p.ws.rows_padded / p.block_m) + rows / p.block_m) * p.turns_per_tile + threadIdx.x] = 0;

  // Four threads per row, each summing every fourth column pair.
  const int part = threadIdx.x % 4;
  const int64_t row = c.chunk * kRowsPerCta + threadIdx.x / 4;
  float sum = 0.0f;
  if (row < p.seqlen_q)
    for (int col = 2 * part; col < p.head_dim; col += 8) {
      const float2 o = load_pair<Bf16>(p.out, c.batch, row, c.head, col);
      const float2 g = load_pair<Bf16>(p.dout, c.batch, row, c.head, col);
      sum = fmaf(o.x, g.x, fmaf(o.y, g.y, sum));
    }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (part != 0) return;
  const int64_t index = c.pair * p.ws.rows_padded + row;
  float lse2 = INFINITY;  // padding rows and fully masked rows: P = exp2(x - inf) = 0
  if (row < p.seqlen_q) {
    const float lse = p.lse[c.batch * p.lse_stride_b + c.head * p.lse_stride_h + row * p.lse_stride_s];
    if (lse != -INFINITY) lse2 = lse * num::kLog2e;
  }
  p.ws.lse_log2[index] = lse2;
  p.ws.dsum[index] = row < p.seqlen_q ? sum : 0.0f;
}

template <bool Bf16>
__global__ void __launch_bounds__(kPostThreads) bwd_postprocess(const BwdPrePostParams p) {
  const RowChunk c = row_chunk(p);
  const int thread = threadIdx.x;
  const int units = p.head_dim / kDqUnitCols;
  const float4* accum =
      reinterpret_cast<const float4*>(p.ws.dq_accum + (c.pair * c.chunks + c.chunk) * units * int64_t(kDqUnitFloats));
  for (int unit = 0; unit < units; ++unit)
    for (int g = 0; g < kDqUnitCols / 8; ++g) {
      const float4 v = accum[(unit * (kDqUnitCols / 8) + g) * kWarpgroupThreads + thread];
      // Registers 4g .. 4g + 3 of the unit's accumulator: (row r, cols c, c + 1), then (row r + 8, same cols).
      const float values[4] = {v.x, v.y, v.z, v.w};
      for (int half = 0; half < 2; ++half) {
        const int reg = 4 * g + 2 * half;
        const int64_t row = c.chunk * kRowsPerCta + ptx::accumulator_row(thread, reg);
        if (row >= p.seqlen_q) continue;
        const int col = unit * kDqUnitCols + ptx::accumulator_col(thread, reg);
        const float lo = values[2 * half] * p.scale, hi = values[2 * half + 1] * p.scale;
        const uint16_t lo_bits = Bf16 ? num::float_to_bf16_bits(lo) : num::float_to_f16_bits(lo);
        const uint16_t hi_bits = Bf16 ? num::float_to_bf16_bits(hi) : num::float_to_f16_bits(hi);
        uint16_t* dst = static_cast<uint16_t*>(p.dq.data) + c.batch * p.dq.stride_b + row * p.dq.stride_s +
                        c.head * p.dq.stride_h + col;
        if (p.dq.pairs_aligned) {
          *reinterpret_cast<uint32_t*>(dst) = uint32_t(lo_bits) | (uint32_t(hi_bits) << 16);
        } else {
          dst[0] = lo_bits;
          dst[1] = hi_bits;
        }
      }
    }
}

uint32_t row_chunk_grid(const BwdPrePostParams& p, int64_t batch) {
  return uint32_t(batch * p.heads_q * (p.ws.rows_padded / kRowsPerCta));
}

}  // namespace

cudaError_t launch_bwd_preprocess(DType dtype, const BwdPrePostParams& p, int64_t batch, cudaStream_t stream) {
  const uint32_t grid = row_chunk_grid(p, batch);
  if (dtype == DType::bf16)
    bwd_preprocess<true><<<grid, kPreThreads, 0, stream>>>(p);
  else
    bwd_preprocess<false><<<grid, kPreThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_bwd_postprocess(DType dtype, const BwdPrePostParams& p, int64_t batch, cudaStream_t stream) {
  const uint32_t grid = row_chunk_grid(p, batch);
  if (dtype == DType::bf16)
    bwd_postprocess<true><<<grid, kPostThreads, 0, stream>>>(p);
  else
    bwd_postprocess<false><<<grid, kPostThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace fa4::sm90
