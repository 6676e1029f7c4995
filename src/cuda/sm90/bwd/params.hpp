// What the host hands the sm_90a backward kernels (bwd/launch.cu builds them once per call). The main kernel's
// parameters travel as a __grid_constant__ (the tensor maps must stay in parameter space for TMA).
#pragma once

#include <cuda.h>  // CUtensorMap (type only)

#include <cstdint>

#include "numerics/host_device.hpp"
#include "numerics/mask.hpp"
#include "numerics/online_softmax.hpp"
#include "trace/format.hpp"

namespace fa4::sm90 {

// A [batch, seqlen, heads, head_dim] tensor addressed element by element (any strides, head_dim contiguous).
struct StridedRows {
  void* data = nullptr;
  int64_t stride_b = 0, stride_s = 0, stride_h = 0;
  bool pairs_aligned = true;  // base and strides even: a column pair is one aligned 32-bit access
  bool chunks_aligned = true; // base 16-byte aligned, strides multiples of 8: 8 columns are one 16-byte access
};

// The workspace, as bwd/config.hpp lays it out (regions: batch·heads_q pairs of rows_padded rows, or for a
// variable-length batch heads_q regions of rows_total rows).
struct BwdWorkspace {
  float* dq_accum = nullptr;  // [chains][regions][region rows/64][head_dim/64] units of 64 × 64
  float* lse_log2 = nullptr;  // [regions][region rows]
  float* dsum = nullptr;      // [regions][region rows]
  int32_t* dq_turn = nullptr; // [chains][regions][region rows/block_m][consumer warpgroups]
  int32_t rows_padded = 0;    // a sequence's rows padded to block_m (dense: the region's rows)
  int64_t rows_total = 0;     // variable-length batches: a head's region (0: dense)
  int32_t chains = 1;  // deterministic mode's turn chains (dq_turn_of); 1 otherwise
  int64_t dq_accum_copy_floats = 0, dq_turn_copy_counters = 0;  // one chain's share of dq_accum and dq_turn
};

// The workspace row of query row 0 of (batch, head): every LSE₂ / D index is this plus the row, a dQ unit's row
// chunk this / 64 plus the row / 64, a turn counter's tile this / block_m plus m_block. Dense: pair · rows_padded;
// a variable-length batch (ws.rows_total > 0, q_row0 = cu_seqlens_q[batch]): the compact layout's base(b).
FA4_HD int64_t bwd_ws_row_base(const BwdWorkspace& ws, int64_t batch, int64_t head, int64_t heads_q, int64_t q_row0,
                               int block_m) {
  if (ws.rows_total == 0) return (batch * heads_q + head) * ws.rows_padded;
  return head * ws.rows_total + (q_row0 + batch * block_m) / block_m * block_m;
}

struct BwdParams {
  // Rank-4 maps {head_dim, seqlen, heads, batch}; boxes {64, block_m, 1, 1} for Q and dO, {64, block_n, 1, 1}
  // for K and V; a collapsed (broadcast or size-1) heads/batch dim has extent 1 and a coordinate step of 0.
  CUtensorMap q_map, dout_map, k_map, v_map;
  // dK and dV, boxes {64, 64, 1, 1}, when both are TMA-addressable (dkv_tma): the epilogue stores by TMA.
  CUtensorMap dk_map, dv_map;
  bool dkv_tma = false;
  int32_t q_head_step = 1, q_batch_step = 1, dout_head_step = 1, dout_batch_step = 1;
  int32_t k_head_step = 1, k_batch_step = 1, v_head_step = 1, v_batch_step = 1;

  BwdWorkspace ws;
  StridedRows dk, dv;  // [batch, seqlen_k, heads_kv, head_dim]

  int32_t seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0;
  int32_t group = 1;     // query heads per kv head
  int32_t n_blocks = 0;  // key blocks of block_n per (batch, kv head)
  // CTAs per (batch, kv head): n_blocks, rounded up to even with cluster_pair (the odd one out is a phantom block
  // past seqlen_k that keeps its peer's protocol). grid = n_block_slots · heads_kv · batch.
  int32_t n_block_slots = 0;
  // Work items: one per (key block slot, kv head, batch), item i as CTA i of a grid of n_block_slots · heads_kv ·
  // batch. A persistent grid (the rotated walk's) has fewer CTAs, each taking items blockIdx.x, + gridDim.x, ...
  // (a multiple of n_block_slots: a CTA keeps its key block slot).
  int32_t work_items = 0;
  int32_t m_tiles = 0;  // query tiles of block_m per (batch, query head)
  // Deterministic mode without a mask, where it fits: the rotated walk (walk_order.hpp; perf-log B29; off with
  // FA4_BWD_DET_ROTATED=0), on a persistent cooperative grid that holds every key block of a (batch, kv head) at once.
  bool rotated_walk = false;
  bool cluster_pair = false;      // clusters of two CTAs on neighbouring key blocks (docs/sm90-backward.md)
  bool pair_dq_exchange = false;  // the pair sums its dQ slabs through DSMEM (else each CTA adds its own)
  num::Mask mask;
  num::ScoreTransform score;  // raw q·k -> log2 units (scale, softcap)
  float scale = 1.0f;         // softmax scale: dK = scale · Σ dSᵀ·Q (dQ's is applied by the postprocess)
  bool deterministic = false; // dQ slabs added in key-block order (ws.dq_turn), bitwise reproducible
  // Set only for deterministic column-split rows: helper warps pass the turns (dq_reduce.cuh; the default,
  // FA4_BWD_DET_HELPER=0 turns it off). Key-split rows have helpers with det_register_adds alone.
  bool det_turn_helpers = false;
  // Deterministic key-split rows: the dQ writer passes each slab's turn once that slab's add is performed, not
  // after the tile's last (the default; FA4_BWD_DET_SLAB_RELEASE=0 is off; perf-log B14).
  bool det_slab_release = false;
  // Deterministic mode: the first adder of each chain (turn 0) stores its slab instead of adding it, so the
  // preprocess zeroes no accumulator copy (the default, perf-log B15; FA4_BWD_DET_STORE_FIRST=0 is off; the
  // postprocess skips a copy whose turn counter stayed 0: no block of that chain visited the tile).
  bool det_store_first = false;
  // Deterministic mode without the pair, rows with BwdTile::det_staging_buffers = 2: each warpgroup stages in two
  // buffers, one per dQ writer (FA4_BWD_DET_TWO_BUFFERS, on by default: perf-log B23).
  bool det_two_buffers = false;
  // Deterministic mode, key-split rows without the pair: each warpgroup adds its dQ slab from its registers in its
  // turn, the turn waited for and passed on by a helper warp per warpgroup (as the column-split rows), no staging
  // and no writer (FA4_BWD_DET_REGISTER_ADDS, an A/B switch: perf-log B24).
  bool det_register_adds = false;
  // Key-split rows outside deterministic mode and the CTA pair: each consumer warpgroup adds its dQ slab from its
  // registers (red.global.add.v4.f32, as the column-split rows do) instead of staging it for the dQ writer
  // (FA4_BWD_DQ_REGISTER_ADDS; by default the row's BwdTile::dq_register_adds: perf-log B20).
  bool dq_register_adds = false;
  // The main kernel as a programmatic dependent launch of the kernel before it (FA4_BWD_PDL, an A/B switch: the
  // preprocess, or the sink gradient after it); also whether it triggers its own dependents (the postprocess).
  bool programmatic = false;
  // Variable-length batches (the bwd_kernel<..., Varlen = true> instances only; null otherwise): q, dout, k, v,
  // dk, dv are their packed rows mapped as batch 1; sequence b has query rows cu_seqlens_q[b] .. [b + 1] and keys
  // from cu_seqlens_k[b] (seqused_k[b] of them when given, else up to cu_seqlens_k[b + 1]). batch above is the
  // sequence count, seqlen_q / seqlen_k / mask / n_blocks the longest sequence's; each CTA takes its own
  // (work.cuh, BwdVarlenWork). A tile's rows past its sequence load as zeros (16-row and 1-row boxes of the
  // *_map16 / *_map1 maps, then out-of-bounds boxes): they belong to the next sequence or to no sequence, and a
  // NaN there would reach dK and dV (dS = 0 times it), or dQ (through K and V).
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;
  CUtensorMap q_map16, q_map1, dout_map16, dout_map1, k_map16, k_map1, v_map16, v_map1;  // boxes {64, 16 | 1, 1, 1}
#if FA4_TRACE
  trace::Sink trace;  // trace builds only (cuda/trace/recorder.cuh): the untraced parameters keep their layout
#endif
};

// Preprocess and postprocess: plain pointers and strides.
struct BwdPrePostParams {
  StridedRows out, dout, dq;  // [batch, seqlen_q, heads_q, head_dim]
  const float* lse = nullptr;
  int64_t lse_stride_b = 0, lse_stride_h = 0, lse_stride_s = 0;
  BwdWorkspace ws;
  int32_t seqlen_q = 0, heads_q = 0, head_dim = 0;
  // Variable-length batches: out, dout, dq are packed [total_q, h, d] rows (batch strides 0), lse [h, total_q]
  // (lse_stride_b 0), sequence b's rows from cu_seqlens_q[b] (device int32, batch + 1); seqlen_q is the longest.
  const int32_t* cu_seqlens_q = nullptr;
  int32_t block_m = 64, turns_per_tile = 1;  // the main kernel's query tile and dq_turn counters per tile
  // Deterministic mode: the postprocess reads the turn counters (a copy whose counter is 0 was never written).
  bool deterministic = false, det_store_first = false;
  bool programmatic = false;  // the postprocess as a programmatic dependent launch of the main kernel (FA4_BWD_PDL)
  float scale = 1.0f;
  // Attention sinks (fp32 [heads_q], null: none) and their gradient (null: not requested), element strides.
  const float* sinks = nullptr;
  float* dsinks = nullptr;
  int64_t sinks_stride = 0, dsinks_stride = 0;
};

}  // namespace fa4::sm90
