// What the host hands the sm_90a forward kernel: tensor maps for the TMA loads, plain pointers and strides for
// the outputs, the problem sizes and the resolved numerics policy. Built once per call by launch.cu, passed as
// a __grid_constant__ kernel parameter (the tensor maps must stay in parameter space for TMA).
#pragma once

#include <cuda.h>  // CUtensorMap (type only)

#include <cstdint>

#include "cuda/fast_divmod.hpp"
#include "numerics/mask.hpp"
#include "numerics/online_softmax.hpp"
#include "cuda/sm90/split_combine.hpp"
#include "cuda/sm90/tile_order.hpp"
#include "trace/format.hpp"

namespace fa4::sm90 {

struct FwdParams {
  // Rank-4 maps over [batch, seqlen, heads, head_dim] seen innermost first: {head_dim, seqlen, heads, batch},
  // boxes {64, rows, 1, 1} with the 128-byte swizzle (reference/fa3.md §3.7). A stride-0 (broadcast) heads or
  // batch dimension is mapped with extent 1; its coordinate is then multiplied by a step of 0 below.
  CUtensorMap q_map;
  CUtensorMap k_map;  // unused (never loaded) when seqlen_k == 0
  CUtensorMap v_map;
  int32_t q_head_step = 1, q_batch_step = 1;    // TMA coordinate = index · step (0 for a broadcast dim)
  int32_t k_head_step = 1, k_batch_step = 1;
  int32_t v_head_step = 1, v_batch_step = 1;

  // O: [batch, seqlen_q, heads, head_dim], element strides, head_dim contiguous. LSE: [batch, heads, seqlen_q].
  // out_map (boxes {64, 64, 1, 1}) when out_tma: base and strides 16-byte aligned, so the epilogue stores by TMA.
  CUtensorMap out_map;
  bool out_tma = false;
  void* out = nullptr;
  int64_t out_stride_b = 0, out_stride_s = 0, out_stride_h = 0;
  bool out_pairs_aligned = true;  // base and strides even: a column pair is one aligned 32-bit store
  // A work tile's first S waits for the consumer's turn at the tensor core (FA4_FWD_PROLOGUE_TURN, an A/B switch;
  // false: issued outside the turns, perf-log F14).
  bool prologue_turn = true;
  float* lse = nullptr;  // null: not requested
  int64_t lse_stride_b = 0, lse_stride_h = 0, lse_stride_s = 0;
  // Attention sinks: fp32 [heads_q] natural-log logits, one per query head (null: none). A sink joins every
  // row's denominator as a key of value zero (RowState's start, mma_softmax.cuh).
  const float* sinks = nullptr;
  int64_t sinks_stride = 0;

  // Split-KV (order.num_splits > 1): each tile's O, normalised over its key range (fp32, [head_dim] per row),
  // and its LSE go to partials of [num_splits][batch][heads][seqlen_q] rows instead of out and lse (then out_tma
  // is false, lse and sinks null); split_combine.cu merges them.
  float* o_partial = nullptr;
  float* lse_partial = nullptr;
  // Split-KV merged inside the forward (FA4_FWD_CLUSTER_COMBINE; launch.cu): a tile's num_splits ranges are one
  // cluster of consecutive CTAs, one range each (the grid is every tile once). After writing its partials every
  // consumer thread passes the cluster barrier, then the cluster's consumer warps merge the tile's rows
  // (epilogue.cuh, merge_split_row) with `combine`, the combine kernel's view of the call (unpacked rows).
  bool cluster_combine = false;
  SplitCombineParams combine;

  int32_t seqlen_q = 0, seqlen_k = 0;
  int32_t group = 1;  // query heads per kv head: kv head = h / group
  // Work tiles: ceil(seqlen_q / block_m) query blocks × heads_q × batch, walked in `order` (scheduler.cuh).
  TileOrder order;                   // lpt: the causal (dynamic, longest-first) order
  uint32_t* tile_counter = nullptr;  // order.lpt, or a variable-length batch: zeroed on the stream before each launch

  num::Mask mask;
  num::ScoreTransform score;    // raw q·k -> log2 units (scale, softcap)
  float rescale_threshold = 8;  // tau, log2 units
  int32_t exp2_emulated_per16 = 0;

  // Variable-length batches (the fwd_kernel<..., Varlen = true> instances only): q, out [total_q, h, d] and
  // k, v [total_k, h_kv, d] mapped as batch 1; sequence b has rows cu_seqlens_q[b] .. [b + 1] and keys
  // cu_seqlens_k[b] .. (seqused_k[b] of them when given, else up to cu_seqlens_k[b + 1]); lse is [h, total_q].
  // The order's batch is the sequence count and its num_m_blocks covers max_seqlen_q; seqlen_q / seqlen_k and
  // mask above are the longest sequence's, and each tile takes its own (scheduler.cuh, SeqGeometry).
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;
  // KV cache (the same instances, cu_seqlens_q == cu_seqlens_k == nullptr): q, out, lse are the dense [batch, ...]
  // tensors (seqlen_q rows each); sequence b attends to seqused_k[b] + seqlen_k_added keys (seqused_k null:
  // seqlen_k). Contiguous cache: k_map / v_map over [batch, seqlen_cache, h_kv, d]. Paged (page_table set):
  // k_map / v_map over [num_pages, page_size, h_kv, d], the page in the batch coordinate; key j of sequence b is
  // row j % page_size of page page_table[b · page_table_stride + j / page_size] (page_divmod divides).
  int32_t seqlen_k_added = 0;  // the keys appended in this call (k_new), already in the cache
  const int32_t* page_table = nullptr;
  int32_t page_table_stride = 0;
  cuda::FastDivmod page_divmod;  // by the page size (the producer's per-box page and row; perf-log F30)
  // The instances with per-sequence geometry load a K/V tile in boxes of kv_box_rows rows (block_n; for a paged
  // cache the largest divisor of block_n that fits a page). V's rows past the sequence's keys are loaded as
  // zeros (out-of-bounds boxes; the box that straddles the end in 16-row and 1-row boxes of v_map16 / v_map1):
  // they may hold anything (an unwritten cache, keys past seqused_k), and P = 0 times a NaN is still a NaN in
  // P·V. K's boxes past the end are zeros too (no page-table entry is read for them); the straddling box loads
  // whole (its extra scores are masked to -inf).
  int32_t kv_box_rows = 0;
  // FA4_AB_TOP_PAD (config.hpp, perf-log F53): rows the first query tile starts above row 0 (dense calls of one key
  // range whose keys end with the row; else 0). seqlen_q and mask are then the renumbered rows' (kernel row r is
  // row r − m_shift of q, out and lse). In the padding before v_map16's 64-byte alignment, so the struct's size
  // and every other offset stay as they were (a larger struct changed the default kernels' SASS).
  int32_t m_shift = 0;
  CUtensorMap v_map16;  // boxes {64, 16, 1, 1}
  CUtensorMap v_map1;   // boxes {64, 1, 1, 1}
#if FA4_TRACE
  trace::Sink trace;  // trace builds only (cuda/trace/recorder.cuh): the untraced parameters keep their layout
#endif
};

}  // namespace fa4::sm90
