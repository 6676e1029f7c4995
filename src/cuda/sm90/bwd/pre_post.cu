// The backward's preprocess and postprocess kernels (plain CUDA, no tensor cores), one CTA per 64 query rows of
// one (batch, query head) pair, rows padded to the main kernel's block_m:
//   preprocess:  D = rowsum(dO ∘ O) in fp32, LSE₂ = LSE·log2e (+inf where LSE = -inf and for padding rows, so
//                the main kernel's P is 0 there), the pair's dQ accumulator rows (every turn chain's copy;
//                none with det_store_first) and dQ turn counters zeroed; one launch.
//   postprocess: dQ = accumulator · scale (deterministic mode: the chains' copies summed in order, a copy whose
//                turn counter is 0 skipped), rounded to q's dtype, stored at dq's strides (rows < seqlen_q).
// O, dO and dQ are read/written in 16-byte chunks where base and strides allow, else element-pairwise, at any
// strides (head_dim contiguous).
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
static_assert(kPreThreads >= kBwdMaxConsumerWarpgroups * kBwdMaxDetChains,
              "a preprocess CTA zeroes every turn counter of a query tile with one thread each");
constexpr int kRowsPerCta = kDqUnitRows;

// The CTA's 64 rows (chunk `chunk` of its sequence) of (batch, head): rows < seqlen hold data, at tensor rows
// row0 + row of batch `tensor_batch` (a variable-length batch: its sequence's rows of the packed tensors, batch 0);
// the chunk's workspace rows start at ws_row (bwd_ws_row_base + chunk · 64). A variable-length batch's grid spans
// the longest sequence's tiles: a chunk past its own sequence's last tile has no workspace rows (`owned` false:
// they are the next sequence's) and does nothing.
struct RowChunk {
  int64_t batch, head, chunk, ws_row;
  int64_t seqlen, row0, tensor_batch;
  bool owned;
};
__device__ __forceinline__ RowChunk row_chunk(const BwdPrePostParams& p) {
  RowChunk c;
  const int64_t chunks = p.ws.rows_padded / kRowsPerCta;
  c.chunk = int64_t(blockIdx.x) % chunks;
  const int64_t pair = int64_t(blockIdx.x) / chunks;
  c.head = pair % p.heads_q;
  c.batch = pair / p.heads_q;
  if (p.cu_seqlens_q != nullptr) {
    c.row0 = p.cu_seqlens_q[c.batch];
    c.seqlen = p.cu_seqlens_q[c.batch + 1] - c.row0;
    c.tensor_batch = 0;
  } else {
    c.row0 = 0, c.seqlen = p.seqlen_q, c.tensor_batch = c.batch;
  }
  c.owned = c.chunk * kRowsPerCta < (c.seqlen + p.block_m - 1) / p.block_m * p.block_m || p.ws.rows_total == 0;
  c.ws_row = bwd_ws_row_base(p.ws, c.batch, c.head, p.heads_q, c.row0, p.block_m) + c.chunk * kRowsPerCta;
  return c;
}

template <bool Bf16>
__device__ __forceinline__ float to_float(uint32_t bits16) {
  if constexpr (Bf16) return num::bf16_bits_to_float(uint16_t(bits16));
  else return num::f16_bits_to_float(uint16_t(bits16));
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
  return make_float2(to_float<Bf16>(lo), to_float<Bf16>(hi));
}

// Accumulates the products of 8 columns (one 16-byte chunk of each tensor) into sum, in column order.
template <bool Bf16>
__device__ __forceinline__ float dot_chunk(uint4 o, uint4 g, float sum) {
  const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    sum = fmaf(to_float<Bf16>(ow[j] & 0xffffu), to_float<Bf16>(gw[j] & 0xffffu), sum);
    sum = fmaf(to_float<Bf16>(ow[j] >> 16), to_float<Bf16>(gw[j] >> 16), sum);
  }
  return sum;
}

__device__ __forceinline__ uint4 load_chunk(const StridedRows& t, int64_t b, int64_t s, int64_t h, int col) {
  return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(t.data) + b * t.stride_b + s * t.stride_s +
                                         h * t.stride_h + col);
}

// D = rowsum(dO ∘ O): eight lanes per row, lane l summing the 8-column chunks l, l + 8, .. (16-byte loads when
// both tensors allow them, else column pairs), then a fixed shuffle tree, so D is the same on every run.
constexpr int kLanesPerRow = 8, kRowsPerPass = kPreThreads / kLanesPerRow, kPasses = kRowsPerCta / kRowsPerPass;
constexpr int kMaxChunksPerLane = 256 / (8 * kLanesPerRow);  // head_dim <= 256
static_assert(kRowsPerCta % kRowsPerPass == 0 && 32 % kLanesPerRow == 0, "whole rows per pass, rows within a warp");

// The row this thread's lane group sums in pass `pass`.
__device__ __forceinline__ int64_t pass_row(const RowChunk& c, int pass) {
  return c.chunk * kRowsPerCta + pass * kRowsPerPass + threadIdx.x / kLanesPerRow;
}

template <bool Bf16>
__device__ __forceinline__ void row_sums(const BwdPrePostParams& p, const RowChunk& c, float (&sum)[kPasses]) {
  const int lane = threadIdx.x % kLanesPerRow;
  int64_t row[kPasses];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    row[pass] = pass_row(c, pass);
    sum[pass] = 0.0f;
  }
  if (p.out.chunks_aligned && p.dout.chunks_aligned) {
    uint4 o[kPasses][kMaxChunksPerLane], g[kPasses][kMaxChunksPerLane];  // every load in flight before the sums
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
#pragma unroll
      for (int k = 0; k < kMaxChunksPerLane; ++k) {
        const int col = 8 * (k * kLanesPerRow + lane);
        if (row[pass] < c.seqlen && col < p.head_dim) {
          o[pass][k] = load_chunk(p.out, c.tensor_batch, c.row0 + row[pass], c.head, col);
          g[pass][k] = load_chunk(p.dout, c.tensor_batch, c.row0 + row[pass], c.head, col);
        }
      }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
#pragma unroll
      for (int k = 0; k < kMaxChunksPerLane; ++k)
        if (row[pass] < c.seqlen && 8 * (k * kLanesPerRow + lane) < p.head_dim)
          sum[pass] = dot_chunk<Bf16>(o[pass][k], g[pass][k], sum[pass]);
  } else {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
      if (row[pass] < c.seqlen)
        for (int col0 = 8 * lane; col0 < p.head_dim; col0 += 8 * kLanesPerRow)
#pragma unroll
          for (int col = col0; col < col0 + 8; col += 2) {
            const float2 o = load_pair<Bf16>(p.out, c.tensor_batch, c.row0 + row[pass], c.head, col);
            const float2 g = load_pair<Bf16>(p.dout, c.tensor_batch, c.row0 + row[pass], c.head, col);
            sum[pass] = fmaf(o.y, g.y, fmaf(o.x, g.x, sum[pass]));
          }
  }
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass)
#pragma unroll
    for (int offset = 1; offset < kLanesPerRow; offset *= 2)
      sum[pass] += __shfl_xor_sync(0xffffffffu, sum[pass], offset);
}

template <bool Bf16>
__global__ void __launch_bounds__(kPreThreads) bwd_preprocess(const BwdPrePostParams p) {
  // A main kernel launched as a programmatic dependent (FA4_BWD_PDL) may be scheduled once every CTA of this grid
  // has started; it waits for this grid's completion before touching global memory.
  if (p.programmatic && threadIdx.x == 0) cudaTriggerProgrammaticLaunchCompletion();
  const RowChunk c = row_chunk(p);
  if (!c.owned) return;
  // Every turn chain's accumulator copy (one outside deterministic mode); none when each chain's first adder
  // stores its slab (the postprocess then skips a copy no block of its chain wrote).
  for (int chain = 0; chain < (p.det_store_first ? 0 : p.ws.chains); ++chain) {
    float4* accum = reinterpret_cast<float4*>(p.ws.dq_accum + chain * p.ws.dq_accum_copy_floats +
                                              c.ws_row / kDqUnitRows * p.head_dim * int64_t(kDqUnitRows));
    for (int i = threadIdx.x; i < kRowsPerCta * p.head_dim / 4; i += kPreThreads) accum[i] = make_float4(0, 0, 0, 0);
  }
  // The first row chunk of each main-kernel query tile zeroes the tile's deterministic-mode turn counters.
  if (c.ws_row % p.block_m == 0 && threadIdx.x < p.turns_per_tile * p.ws.chains) {
    const int chain = threadIdx.x / p.turns_per_tile, slot = threadIdx.x % p.turns_per_tile;
    p.ws.dq_turn[chain * p.ws.dq_turn_copy_counters + c.ws_row / p.block_m * p.turns_per_tile + slot] = 0;
  }

  float sum[kPasses];
  row_sums<Bf16>(p, c, sum);
  if (threadIdx.x % kLanesPerRow != 0) return;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int64_t row = pass_row(c, pass);
    const int64_t index = c.ws_row + (row - c.chunk * kRowsPerCta);
    float lse2 = INFINITY;  // padding rows and fully masked rows: P = exp2(x - inf) = 0
    if (row < c.seqlen) {
      const float lse =
          p.lse[c.tensor_batch * p.lse_stride_b + c.head * p.lse_stride_h + (c.row0 + row) * p.lse_stride_s];
      if (lse != -INFINITY) lse2 = lse * num::kLog2e;
    }
    p.ws.lse_log2[index] = lse2;
    p.ws.dsum[index] = row < c.seqlen ? sum[pass] : 0.0f;
  }
}

// dQ = accumulator · scale in q's dtype. The accumulator units are in wgmma accumulator order (a thread's float4
// is rows r and r + 8, two columns each); when dq takes 16-byte stores the 64 rows are first rounded into shared
// memory (a row pitch of head_dim + 8 elements: a warp's 32-bit writes hit 32 banks) and then written as whole
// 16-byte chunks, consecutive threads along a row; else each thread stores its column pairs.
constexpr int kPostPitchMax = 256 + 8;

template <bool Bf16>
__device__ __forceinline__ uint32_t round_pair(float lo, float hi) {
  const uint16_t lo_bits = Bf16 ? num::float_to_bf16_bits(lo) : num::float_to_f16_bits(lo);
  const uint16_t hi_bits = Bf16 ? num::float_to_bf16_bits(hi) : num::float_to_f16_bits(hi);
  return uint32_t(lo_bits) | (uint32_t(hi_bits) << 16);
}

template <bool Bf16>
__global__ void __launch_bounds__(kPostThreads) bwd_postprocess(const BwdPrePostParams p) {
  __shared__ alignas(16) uint16_t rounded[kRowsPerCta * kPostPitchMax];
  cudaGridDependencySynchronize();  // a programmatic dependent of the main kernel (FA4_BWD_PDL); else a no-op
  const RowChunk c = row_chunk(p);
  if (!c.owned) return;
  const int thread = threadIdx.x;
  const int units = p.head_dim / kDqUnitCols;
  const int pitch = p.head_dim + 8;
  const bool through_smem = p.dq.chunks_aligned;
  const float4* accum =
      reinterpret_cast<const float4*>(p.ws.dq_accum + c.ws_row / kDqUnitRows * units * int64_t(kDqUnitFloats));
  // Deterministic mode: which chains' copies hold the tile (a copy whose turn counter is 0 was never added to:
  // zero, or with det_store_first never written). Every adder passes the turn of every slot of its tile, so slot
  // 0's counter stands for the tile. Outside it, the one copy (zeroed by the preprocess).
  uint32_t written = 1u;
  if (p.deterministic) {
    written = 0u;
    for (int chain = 0; chain < p.ws.chains; ++chain)
      if (p.ws.dq_turn[chain * p.ws.dq_turn_copy_counters + c.ws_row / p.block_m * p.turns_per_tile] > 0)
        written |= 1u << chain;
  }
  for (int unit = 0; unit < units; ++unit) {
#pragma unroll
    for (int g = 0; g < kDqUnitCols / 8; ++g) {
      const int64_t index = (unit * (kDqUnitCols / 8) + g) * kWarpgroupThreads + thread;
      float4 v = (written & 1u) ? accum[index] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      // Deterministic mode's other turn chains, summed in a fixed order (copy 0 first).
      for (int chain = 1; chain < p.ws.chains; ++chain) {
        if (!(written >> chain & 1u)) continue;
        const float4 w = accum[index + chain * (p.ws.dq_accum_copy_floats / 4)];
        v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
      }
      // Registers 4g .. 4g + 3 of the unit's accumulator: (row r, cols c, c + 1), then (row r + 8, same cols).
      const float values[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int reg = 4 * g + 2 * half;
        const int tile_row = ptx::accumulator_row(thread, reg);
        const int col = unit * kDqUnitCols + ptx::accumulator_col(thread, reg);
        const uint32_t bits = round_pair<Bf16>(values[2 * half] * p.scale, values[2 * half + 1] * p.scale);
        if (through_smem) {
          *reinterpret_cast<uint32_t*>(&rounded[tile_row * pitch + col]) = bits;
          continue;
        }
        const int64_t row = c.chunk * kRowsPerCta + tile_row;
        if (row >= c.seqlen) continue;
        uint16_t* dst = static_cast<uint16_t*>(p.dq.data) + c.tensor_batch * p.dq.stride_b +
                        (c.row0 + row) * p.dq.stride_s + c.head * p.dq.stride_h + col;
        if (p.dq.pairs_aligned) {
          *reinterpret_cast<uint32_t*>(dst) = bits;
        } else {
          dst[0] = uint16_t(bits & 0xffffu);
          dst[1] = uint16_t(bits >> 16);
        }
      }
    }
  }
  if (!through_smem) return;
  __syncthreads();
  const int chunks_per_row = p.head_dim / 8;
  for (int i = thread; i < kRowsPerCta * chunks_per_row; i += kPostThreads) {
    const int tile_row = i / chunks_per_row, col = 8 * (i % chunks_per_row);
    const int64_t row = c.chunk * kRowsPerCta + tile_row;
    if (row >= c.seqlen) continue;
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.dq.data) + c.tensor_batch * p.dq.stride_b +
                              (c.row0 + row) * p.dq.stride_s + c.head * p.dq.stride_h + col) =
        *reinterpret_cast<const uint4*>(&rounded[tile_row * pitch + col]);
  }
}

// The sinks' gradient: dsink_h = -Σ over batch and rows of P_sink · D, P_sink = exp2(sink·log2e - LSE₂) (the
// sink's value is zero, so its dP is 0). Padding and fully masked rows have LSE₂ = +inf (P_sink = 0) and D = 0.
// One CTA per query head; each thread sums a fixed stride of rows in fp64, then a fixed tree: the same bits on
// every run (deterministic mode needs nothing more). A variable-length batch's rows past a sequence's length
// are skipped (in the compact layout they may be the next sequence's or unwritten).
constexpr int kSinkThreads = 256;

__global__ void __launch_bounds__(kSinkThreads) bwd_sink_gradient(const BwdPrePostParams p, int64_t batch) {
  if (p.programmatic && threadIdx.x == 0) cudaTriggerProgrammaticLaunchCompletion();  // as the preprocess
  __shared__ double warp_sums[kSinkThreads / 32];
  const int64_t head = blockIdx.x;
  const double sink2 = double(p.sinks[head * p.sinks_stride]) * double(num::kLog2e);
  const int64_t rows = p.ws.rows_padded;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < batch * rows; i += kSinkThreads) {
    const int64_t b = i / rows, row = i % rows;
    int64_t row0 = 0;
    if (p.cu_seqlens_q != nullptr) {
      row0 = p.cu_seqlens_q[b];
      if (row >= p.cu_seqlens_q[b + 1] - row0) continue;
    }
    const int64_t index = bwd_ws_row_base(p.ws, b, head, p.heads_q, row0, p.block_m) + row;
    const double d = p.ws.dsum[index];
    if (d != 0.0) sum += exp2(sink2 - double(p.ws.lse_log2[index])) * d;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0.0;
#pragma unroll
  for (int w = 0; w < kSinkThreads / 32; ++w) total += warp_sums[w];
  p.dsinks[head * p.dsinks_stride] = float(0.0 - total);
}

// A variable-length batch's gradient rows that no sequence covers: a packed row r is covered by the last sequence
// b with cu[b] <= r when r < cu[b] + its length (used[b], or cu[b + 1] - cu[b]). One warp per row: every lane
// runs the same binary search (broadcast loads), then the warp zeroes the row's heads in column pairs.
constexpr int kZeroThreads = 256, kZeroRowsPerCta = kZeroThreads / 32;

__device__ __forceinline__ void zero_row(const StridedRows& t, int64_t row, int32_t heads, int32_t head_dim) {
  uint16_t* base = static_cast<uint16_t*>(t.data) + row * t.stride_s;
  for (int32_t i = int32_t(threadIdx.x % 32); i < heads * (head_dim / 2); i += 32) {
    uint16_t* dst = base + int64_t(i / (head_dim / 2)) * t.stride_h + 2 * (i % (head_dim / 2));
    if (t.pairs_aligned)
      *reinterpret_cast<uint32_t*>(dst) = 0u;
    else
      dst[0] = dst[1] = 0;
  }
}

__global__ void __launch_bounds__(kZeroThreads) bwd_zero_uncovered(const StridedRows a, const StridedRows b,
                                                                   int64_t rows, int32_t heads, int32_t head_dim,
                                                                   const int32_t* cu, const int32_t* used,
                                                                   int32_t batch) {
  const int64_t row = int64_t(blockIdx.x) * kZeroRowsPerCta + threadIdx.x / 32;
  if (row >= rows) return;
  int32_t lo = 0, hi = batch;  // the last b in [0, batch] with cu[b] <= row (lo), or none (cu[0] > row)
  if (cu[0] > row) {
    lo = -1;
  } else {
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      if (cu[mid] <= row) lo = mid; else hi = mid - 1;
    }
  }
  if (lo >= 0 && lo < batch) {
    const int64_t length = used != nullptr ? used[lo] : cu[lo + 1] - cu[lo];
    if (row < cu[lo] + length) return;
  }
  zero_row(a, row, heads, head_dim);
  if (b.data != nullptr) zero_row(b, row, heads, head_dim);
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

cudaError_t launch_bwd_sink_gradient(const BwdPrePostParams& p, int64_t batch, cudaStream_t stream) {
  if (p.heads_q == 0) return cudaSuccess;
  bwd_sink_gradient<<<uint32_t(p.heads_q), kSinkThreads, 0, stream>>>(p, batch);
  return cudaGetLastError();
}

cudaError_t launch_bwd_zero_uncovered(const StridedRows& a, const StridedRows* b, int64_t rows, int32_t heads,
                                      int32_t head_dim, const int32_t* cu, const int32_t* used, int32_t batch,
                                      cudaStream_t stream) {
  if (rows == 0 || heads == 0) return cudaSuccess;
  const StridedRows none;
  const uint32_t grid = uint32_t((rows + kZeroRowsPerCta - 1) / kZeroRowsPerCta);
  bwd_zero_uncovered<<<grid, kZeroThreads, 0, stream>>>(a, b != nullptr ? *b : none, rows, heads, head_dim, cu, used,
                                                        batch);
  return cudaGetLastError();
}

cudaError_t launch_bwd_postprocess(DType dtype, const BwdPrePostParams& p, int64_t batch, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(row_chunk_grid(p, batch));
  config.blockDim = dim3(kPostThreads);
  config.stream = stream;
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &pdl;
  config.numAttrs = p.programmatic ? 1 : 0;
  return dtype == DType::bf16 ? cudaLaunchKernelEx(&config, bwd_postprocess<true>, p)
                              : cudaLaunchKernelEx(&config, bwd_postprocess<false>, p);
}

}  // namespace fa4::sm90
