// Backward load role: one producer warp; one elected lane loads the CTA's K and V tiles once, then for every
// query head of the group and every query tile that sees the key block: Q and dO by TMA, LSE₂ and D (fp32 rows
// of the workspace) by bulk copy, all four into one stage of the Q ring, armed with the stage's byte count.
// With the CTA pair each CTA loads half of Q and dO for both (multicast) and its own LSE₂ and D; a stage is
// refilled once both CTAs' consumers released it (the ring's empty barriers count the peer's warps too).
// Tiles past seqlen_q/seqlen_k are zero-filled by TMA (the bytes still count); LSE₂ and D are padded in the
// workspace, so their copies never leave it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/pipeline/pipeline.cuh"
#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/elect.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/bwd/shared_storage.cuh"
#include "cuda/sm90/bwd/work.cuh"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/trace_writers.hpp"
#include "cuda/trace/recorder.cuh"

namespace fa4::sm90 {

// The CTA pair: this CTA's half of a [Rows][HeadDim] Q or dO tile, TMA-multicast into both CTAs' stage (same
// offsets), signalling both CTAs' full barriers at `full`'s offset. Rows split when the tile is one head-dim
// chunk (the map's box is Rows / 2 rows), else the chunks split.
template <int HeadDim, int Rows>
__device__ __forceinline__ void load_tile_pair_half(uint8_t* smem_tile, const CUtensorMap* map, int32_t row,
                                                    int32_t head, int32_t batch, uint64_t* full, uint32_t rank) {
  constexpr int kChunks = HeadDim / kSw128Columns;
  constexpr uint16_t kBothCtas = 0b11;
  if constexpr (kChunks == 1) {
    const int32_t coords[4] = {0, row + int32_t(rank) * (Rows / 2), head, batch};
    ptx::tma_load_multicast(smem_tile + rank * (Rows / 2) * ptx::kSw128RowBytes, map, coords, full, kBothCtas);
  } else {
#pragma unroll
    for (int c = 0; c < kChunks / 2; ++c) {
      const int chunk = int(rank) * (kChunks / 2) + c;
      const int32_t coords[4] = {chunk * kSw128Columns, row, head, batch};
      ptx::tma_load_multicast(smem_tile + chunk * Rows * ptx::kSw128RowBytes, map, coords, full, kBothCtas);
    }
  }
}

// Varlen: each item's sequence's rows of the packed tensors (batch 1), rows past its end as zeros. Per work item
// the K/V stage is refilled once the consumers have released it (after their epilogue, which stages dK and dV in
// the K/V tiles); the Q ring's state runs on over the items.
template <int Row, bool Varlen>
__device__ __forceinline__ void bwd_load_role(const BwdParams& p, BwdSharedStorage<Row>& smem) {
  using Config = BwdConfig<Row>;
  constexpr int HeadDim = Config::kHeadDim, BlockM = Config::kBlockM, BlockN = Config::kBlockN;
  if (!ptx::elect_one_sync()) return;
  trace::Recorder rec(FA4_TRACE_SINK(p), kBwdTraceLoadWriter, true);
  ptx::prefetch_tensormap(&p.q_map);
  ptx::prefetch_tensormap(&p.dout_map);
  const BwdRing<Row, 1> kv_ring(smem.kv_ring);
  auto kv_stage = cuda::producer_start_state<1>();
  const BwdRing<Row, Config::kStages> q_ring(smem.q_ring);
  const uint32_t rank = p.cluster_pair ? ptx::cluster_ctarank() : 0u;
  auto stage = cuda::producer_start_state<Config::kStages>();
  for_each_work_item<BlockM, BlockN, Varlen>(p, [&](const auto& work) {
    using Work = std::decay_t<decltype(work)>;
    if (work.empty()) return;  // the consumers store zeros without waiting for anything
    kv_ring.producer_acquire(kv_stage);
    kv_ring.producer_expect_tx(kv_stage, 2 * Config::kKvTileBytes);
    if constexpr (Work::kVarlen) {
      const int32_t key0 = work.n_block * BlockN, keys = work.seqlen_k(p) - key0;  // > 0: the walk is not empty
      load_tile_in_sequence<HeadDim, BlockN>(smem.k, &p.k_map, &p.k_map16, &p.k_map1, work.k_row0() + key0, keys,
                                             work.kv_head * p.k_head_step, 0, kv_ring.full_barrier(kv_stage));
      load_tile_in_sequence<HeadDim, BlockN>(smem.v, &p.v_map, &p.v_map16, &p.v_map1, work.k_row0() + key0, keys,
                                             work.kv_head * p.v_head_step, 0, kv_ring.full_barrier(kv_stage));
    } else {
      load_tile<HeadDim, BlockN>(smem.k, &p.k_map, work.n_block * BlockN, work.kv_head * p.k_head_step,
                                 work.batch * p.k_batch_step, kv_ring.full_barrier(kv_stage));
      load_tile<HeadDim, BlockN>(smem.v, &p.v_map, work.n_block * BlockN, work.kv_head * p.v_head_step,
                                 work.batch * p.v_batch_step, kv_ring.full_barrier(kv_stage));
    }
    ++kv_stage;
    FA4_TRACE_RECORD(rec, trace::Kind::tma_issue, trace::Operand::k);

    for (TileWalk walk(p, work); walk.more(); walk.next(p, work), ++stage) {
      const int32_t h = walk.head, m_block = walk.m_block;
      FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::stage_free);
      q_ring.producer_acquire(stage);
      FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::stage_free);
      q_ring.producer_expect_tx(stage, Config::kQStageBytes);
      uint64_t* full = q_ring.full_barrier(stage);
      if constexpr (Work::kVarlen) {
        const int32_t row0 = m_block * BlockM, rows = work.seqlen_q(p) - row0;  // > 0: the tile is in the walk
        load_tile_in_sequence<HeadDim, BlockM>(smem.q[stage.index], &p.q_map, &p.q_map16, &p.q_map1,
                                               work.q_row0() + row0, rows, h * p.q_head_step, 0, full);
        load_tile_in_sequence<HeadDim, BlockM>(smem.dout[stage.index], &p.dout_map, &p.dout_map16, &p.dout_map1,
                                               work.q_row0() + row0, rows, h * p.dout_head_step, 0, full);
      } else if (Config::kPairCapable && p.cluster_pair) {  // the stage's bytes: this CTA's halves and the peer's
        load_tile_pair_half<HeadDim, BlockM>(smem.q[stage.index], &p.q_map, m_block * BlockM, h * p.q_head_step,
                                             work.batch * p.q_batch_step, full, rank);
        load_tile_pair_half<HeadDim, BlockM>(smem.dout[stage.index], &p.dout_map, m_block * BlockM,
                                             h * p.dout_head_step, work.batch * p.dout_batch_step, full, rank);
      } else {
        load_tile<HeadDim, BlockM>(smem.q[stage.index], &p.q_map, m_block * BlockM, h * p.q_head_step,
                                   work.batch * p.q_batch_step, full);
        load_tile<HeadDim, BlockM>(smem.dout[stage.index], &p.dout_map, m_block * BlockM, h * p.dout_head_step,
                                   work.batch * p.dout_batch_step, full);
      }
      const int64_t row = work.template ws_row_base<BlockM>(p, h) + int64_t(m_block) * BlockM;
      ptx::bulk_load(smem.lse_log2[stage.index], p.ws.lse_log2 + row, Config::kRowVectorBytes, full);
      ptx::bulk_load(smem.dsum[stage.index], p.ws.dsum + row, Config::kRowVectorBytes, full);
      FA4_TRACE_RECORD(rec, trace::Kind::tma_issue, trace::Operand::q);
    }
  });
  FA4_TRACE_FINISH(rec);
}

}  // namespace fa4::sm90
