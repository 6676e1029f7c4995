// Split-KV's merge of one query row: the partials of the forward's key ranges (fp32 O normalised over its range,
// and its LSE; params.hpp) into out and lse with the LSE rule of numerics/split_merge.hpp, the attention sink
// joining the denominator once, here. One warp per row. Run by the combine kernel (split_combine.cu) and, when
// a tile's ranges run as one cluster, by the forward's consumer warps after the cluster barrier (epilogue.cuh).
// Nothing waits on one load at a time (each is a trip to DRAM or L2, and a row has up to 64 ranges): the lanes
// read the ranges' LSEs together (lane l: ranges l, l + 32, ...) and join their merge states by shuffles; then
// each lane owns 4 columns (a float4 of every range's O, loads issued 16 ranges ahead of their use; the first 16
// of the first column pass issued with the LSE loads, perf-log F13) with the ranges' weights broadcast from the
// lane that read their LSE.
#pragma once

#include <cstdint>

#include "cuda/sm90/split_combine.hpp"
#include "numerics/convert.hpp"
#include "numerics/split_merge.hpp"

namespace fa4::sm90 {
namespace split_combine_detail {

constexpr int kColumnsPerLane = 4;  // a float4 of O per range
constexpr int kLoadsAhead = 16;     // O loads in flight per lane (the fill rule's 16 ranges in one go)

template <bool Bf16>
__device__ __forceinline__ void store_columns(uint16_t* out, float4 acc, bool pairs_aligned) {
  const float v[4] = {acc.x, acc.y, acc.z, acc.w};
  uint16_t bits[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) bits[c] = Bf16 ? num::float_to_bf16_bits(v[c]) : num::float_to_f16_bits(v[c]);
  if (pairs_aligned) {
    reinterpret_cast<uint32_t*>(out)[0] = uint32_t(bits[0]) | (uint32_t(bits[1]) << 16);
    reinterpret_cast<uint32_t*>(out)[1] = uint32_t(bits[2]) | (uint32_t(bits[3]) << 16);
  } else {
#pragma unroll
    for (int c = 0; c < 4; ++c) out[c] = bits[c];
  }
}

}  // namespace split_combine_detail

// Row `row` of the unpacked [batch][heads_q][seqlen_q] rows (0 <= row < rows), by the whole warp (lane = its lane).
// The partials are read with plain loads: the forward that wrote them has finished (the combine kernel) or
// released them at cluster scope (barrier.cluster, which this warp's threads have waited on).
template <bool Bf16>
__device__ __forceinline__ void merge_split_row(const SplitCombineParams& p, int64_t row, int lane) {
  using namespace split_combine_detail;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  const int64_t i = row % p.seqlen_q, h = row / p.seqlen_q % p.heads_q, b = row / (int64_t(p.seqlen_q) * p.heads_q);

  // The first column pass's O of the first kLoadsAhead ranges, issued with the LSE loads below: they do not
  // depend on the weights, so the row costs one memory trip before its adds, not one for the LSEs and one for O.
  const int first_read_col = kColumnsPerLane * lane < p.head_dim ? kColumnsPerLane * lane : 0;
  float4 first_o[kLoadsAhead];
#pragma unroll
  for (int j = 0; j < kLoadsAhead; ++j)
    if (j < p.num_splits)
      first_o[j] = *reinterpret_cast<const float4*>(p.o_partial + (j * rows + row) * p.head_dim + first_read_col);

  // The merged LSE: each lane merges its ranges, then the lanes' states join (butterfly: every lane ends with
  // all of them); the sink joins once, on lane 0's state.
  num::LseMerge<float> merge;
  // The first 32 ranges' LSEs stay in the registers that read them, for their weights below.
  const float first_lse = lane < p.num_splits ? p.lse_partial[lane * rows + row] : -INFINITY;
  merge.add(first_lse);
  for (int s = lane + 32; s < p.num_splits; s += 32) merge.add(p.lse_partial[s * rows + row]);
  if (p.sinks != nullptr && lane == 0) merge.add(p.sinks[h * p.sinks_stride]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_max = __shfl_xor_sync(0xffffffffu, merge.max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, merge.sum, offset);
    merge.add_state(other_max, other_sum);
  }
  merge.finish();
  if (p.lse != nullptr && lane == 0) p.lse[b * p.lse_stride_b + h * p.lse_stride_h + i * p.lse_stride_s] = merge.lse;

  uint16_t* const out = static_cast<uint16_t*>(p.out) + b * p.out_stride_b + i * p.out_stride_s + h * p.out_stride_h;
  // The column loop is uniform over the warp (the shuffles need every lane): a lane past head_dim (d = 64, the
  // second pass of d = 192) reads column 0 instead and stores nothing.
  for (int col0 = 0; col0 < p.head_dim; col0 += 32 * kColumnsPerLane) {
    const int col = col0 + kColumnsPerLane * lane;
    const bool mine = col < p.head_dim;
    const int read_col = mine ? col : 0;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < p.num_splits; s0 += 32) {
      // Lane l holds the weight of range s0 + l (0 past the last range, and for an empty one).
      const float my_lse = s0 == 0 ? first_lse : s0 + lane < p.num_splits ? p.lse_partial[(s0 + lane) * rows + row]
                                                                           : -INFINITY;
      const float my_weight = merge.weight(my_lse);
      const int count = p.num_splits - s0 < 32 ? p.num_splits - s0 : 32;
      auto add = [&](float w, const float4& o) {
        if (w != 0.0f) {  // a select after the load (which stays ahead): an empty range adds nothing, whatever its O
          acc.x = fmaf(w, o.x, acc.x);
          acc.y = fmaf(w, o.y, acc.y);
          acc.z = fmaf(w, o.z, acc.z);
          acc.w = fmaf(w, o.w, acc.w);
        }
      };
      // The first pass's first kLoadsAhead ranges were loaded before the LSE merge.
      const int loaded = col0 == 0 && s0 == 0 ? kLoadsAhead : 0;
      if (loaded > 0) {
#pragma unroll
        for (int j = 0; j < kLoadsAhead; ++j)
          if (j < count) add(__shfl_sync(0xffffffffu, my_weight, j), first_o[j]);
      }
#pragma unroll kLoadsAhead
      for (int j = loaded; j < count; ++j) {
        const float w = __shfl_sync(0xffffffffu, my_weight, j);
        add(w, *reinterpret_cast<const float4*>(p.o_partial + ((s0 + j) * rows + row) * p.head_dim + read_col));
      }
    }
    if (mine) store_columns<Bf16>(out + col, acc, p.out_pairs_aligned);
  }
}

}  // namespace fa4::sm90
