// Load role: one producer warp; one elected lane walks the CTA's work tiles (TileScheduler), publishes each to
// the consumers, and issues every TMA: Q into its one-stage ring, and for each visible K/V tile a K load into
// the K ring and a V load into the V ring, each stage acquired from its Pipeline (blocks while the consumers
// still read it) and armed with the exact byte count it will receive.
// A tile that runs past seqlen_k (or a Q tile past seqlen_q) is zero-filled by TMA; the bytes still count.
#pragma once

#include <cstdint>

#include "cuda/pipeline/pipeline.cuh"
#include "cuda/ptx/elect.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/trace_writers.hpp"
#include "cuda/trace/recorder.cuh"

namespace fa4::sm90 {

// Per tile: publish the tile index; then (unless no key is visible to any of its rows) the first K, Q (once both
// consumers have released the previous Q), the first V, and the remaining K/V pairs. The first K goes before Q
// so that it streams while the consumers finish the previous tile.
// Varlen: a tile's rows and keys start at its sequence's offsets in the packed tensors (mapped as batch 1).
template <int Row, bool Varlen>
__device__ __forceinline__ void load_role(const FwdParams& p, FwdSharedStorage<Row>& smem) {
  using Config = FwdConfig<Row>;
  constexpr int HeadDim = Config::kHeadDim;
  using Ring = cuda::Pipeline<Config::kStages>;
  if (!ptx::elect_one_sync()) return;
  trace::Recorder rec(FA4_TRACE_SINK(p), kFwdTraceLoadWriter, true);

  ptx::prefetch_tensormap(&p.q_map);
  if (p.seqlen_k > 0) {  // else the K/V maps were never encoded (and no K/V tile is ever loaded)
    ptx::prefetch_tensormap(&p.k_map);
    ptx::prefetch_tensormap(&p.v_map);
  }

  const Ring k_ring(smem.k_ring), v_ring(smem.v_ring);
  const cuda::Pipeline<1> q_ring(smem.q_ring);
  const cuda::Pipeline<kTileRingStages> tile_ring(smem.tile_ring);
  auto kv_stage = cuda::producer_start_state<Config::kStages>();
  auto q_stage = cuda::producer_start_state<1>();
  auto tile_stage = cuda::producer_start_state<kTileRingStages>();
  const TileScheduler scheduler(p);
  for (int32_t linear = scheduler.first();; linear = scheduler.next(linear)) {
    FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::tile_slot);
    tile_ring.producer_acquire(tile_stage);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::tile_slot);
    smem.tile_slot[tile_stage.index] = linear;
    tile_ring.producer_commit(tile_stage);
    ++tile_stage;
    if (linear >= p.order.num_tiles()) {
      FA4_TRACE_FINISH(rec);
      return;
    }

    const WorkTile tile = p.order.tile(linear);
    KvTileRange range;
    int32_t q_row0 = 0, k_row0 = 0;  // the sequence's first rows in packed q and k/v (varlen)
    if constexpr (Varlen) {  // tile_kv_range spelled out: through it the dense producer's SASS changes (d = 128)
      const SeqGeometry geo = seq_geometry(p, tile);
      range = kv_tile_range_in_sequence<Config::kBlockM, Config::kBlockN>(tile, geo);
      q_row0 = geo.q_row0, k_row0 = geo.k_row0;
    } else {
      range = kv_tile_range<Config::kBlockM, Config::kBlockN>(p, tile);
    }
    if (range.empty()) continue;  // the consumers write zeros without waiting for anything
    const int32_t kv_head = tile.head / p.group;
    // One K or V tile into its ring (K and V rings step together, on kv_stage).
    auto load_kv = [&](const Ring& ring, uint8_t (&tiles)[Config::kStages][Config::kKvTileBytes],
                       const CUtensorMap* map, int32_t head_step, int32_t batch_step, int32_t n_block) {
      FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::stage_free);
      ring.producer_acquire(kv_stage);
      FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::stage_free);
      ring.producer_expect_tx(kv_stage, Config::kKvTileBytes);
      load_tile<HeadDim, Config::kBlockN>(tiles[kv_stage.index], map, k_row0 + n_block * Config::kBlockN,
                                          kv_head * head_step, tile.batch * batch_step, ring.full_barrier(kv_stage));
    };
    auto load_k = [&](int32_t n_block) {
      load_kv(k_ring, smem.k, &p.k_map, p.k_head_step, p.k_batch_step, n_block);
      FA4_TRACE_RECORD(rec, trace::Kind::tma_issue, trace::Operand::k);
    };
    auto load_v = [&](int32_t n_block) {
      load_kv(v_ring, smem.v, &p.v_map, p.v_head_step, p.v_batch_step, n_block);
      FA4_TRACE_RECORD(rec, trace::Kind::tma_issue, trace::Operand::v);
    };

    load_k(range.begin);
    q_ring.producer_acquire(q_stage);
    q_ring.producer_expect_tx(q_stage, Config::kQTileBytes);
    load_tile<HeadDim, Config::kBlockM>(smem.q, &p.q_map, q_row0 + tile.m_block * Config::kBlockM,
                                        tile.head * p.q_head_step, tile.batch * p.q_batch_step,
                                        q_ring.full_barrier(q_stage));
    FA4_TRACE_RECORD(rec, trace::Kind::tma_issue, trace::Operand::q);
    ++q_stage;
    load_v(range.begin);
    ++kv_stage;
    for (int32_t n_block = range.begin + 1; n_block < range.end; ++n_block, ++kv_stage) {
      load_k(n_block);
      load_v(n_block);
    }
  }
}

}  // namespace fa4::sm90
