// Load role: one producer warp; one elected lane walks the CTA's work tiles (TileScheduler), publishes each to
// the consumers, and issues every TMA: Q into its one-stage ring, and for each visible K/V tile a K load into
// the K ring and a V load into the V ring, each stage acquired from its Pipeline (blocks while the consumers
// still read it) and armed with the exact byte count it will receive.
// A tile that runs past seqlen_k (or a Q tile past seqlen_q) is zero-filled by TMA; the bytes still count.
// (F32's A/B define: a paged call's V loads come from the producer warpgroup's second warp instead, v_load_role.)
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

// One K or V tile (keys n_block·BlockN ..) of a tile's sequence, for the instances with per-sequence geometry:
// boxes of p.kv_box_rows rows from the sequence's rows (packed varlen: k_row0 + key; contiguous cache: the
// batch's rows; paged: the row in the key's page), boxes past the sequence's keys as zeros (a row coordinate
// below 0: every element out of bounds, which TMA fills with zeros and still counts). With `tail` (V: map16 and
// map1 given) the box that holds the sequence's last key goes in 16-row and 1-row boxes, so that its rows past
// the end are zeros as well; K's loads whole. Either way the tile receives BlockN full rows (the ring's byte count).
// The producer reads a paged tile's page indices once, before waiting for the tile's K stage, and hands them to
// both its K and V loads: read after the stage is free, they put a dependent global load on the issue path of
// every tile (paged decode b = 8 s_k = 16k: 80% -> 94% of copy bandwidth, perf-log F9).

// The page of each kv_box_rows box of K/V tile n_block that holds keys of the tile's sequence, read together (one
// memory latency, not one per box). Nothing for a contiguous cache or a packed batch. The array is only ever
// indexed by constants (page_of picks a box's entry with selects): indexed by the issue loop's run-time box, it
// lived in local memory, and each entry's store there waited for its load, so the reads were serial and done
// before the stage wait instead of under it (perf-log F15: paged prefill 0.70 of dense, the contiguous cache 0.92).
template <int BlockN>
struct TilePages {
  static constexpr int kMaxBoxes = BlockN / 16;
  int32_t page[kMaxBoxes];
  __device__ __forceinline__ void read(const FwdParams& p, int32_t batch, int32_t key0, int32_t valid) {
#pragma unroll
    for (int i = 0; i < kMaxBoxes; ++i)
      page[i] = i * p.kv_box_rows < BlockN && i * p.kv_box_rows < valid
                    ? p.page_table[int64_t(batch) * p.page_table_stride +
                                   p.page_divmod.div(uint32_t(key0 + i * p.kv_box_rows))]
                    : 0;
  }
  __device__ __forceinline__ void read(const FwdParams& p, const SeqGeometry& geo, int32_t batch, int32_t n_block) {
    if (p.page_table != nullptr) read(p, batch, n_block * BlockN, geo.seqlen_k - n_block * BlockN);
  }
  __device__ __forceinline__ int32_t page_of(int box) const {
    int32_t r = page[0];
#pragma unroll
    for (int i = 1; i < kMaxBoxes; ++i) r = box == i ? page[i] : r;
    return r;
  }
};

template <int HeadDim, int BlockN>
__device__ __forceinline__ void load_kv_tile_in_sequence(uint8_t* dst, const FwdParams& p, const SeqGeometry& geo,
                                                         const CUtensorMap* map, const CUtensorMap* map16,
                                                         const CUtensorMap* map1, int32_t head, int32_t batch,
                                                         int32_t batch_coord, int32_t n_block, uint64_t* full_barrier,
                                                         const TilePages<BlockN>* pages_read = nullptr) {
  constexpr int kChunks = HeadDim / kSw128Columns;
  constexpr int kMaxBoxes = BlockN / 16;
  const int32_t key0 = n_block * BlockN, box_rows = p.kv_box_rows;
  const int32_t valid = geo.seqlen_k - key0;  // rows of this tile that hold keys (> 0: the range is not empty)
  const bool paged = p.page_table != nullptr;
  auto issue = [&](const CUtensorMap* m, int32_t smem_row, int32_t row, int32_t outer) {
#pragma unroll
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      const int32_t coords[4] = {chunk * kSw128Columns, row, head, outer};
      ptx::tma_load(dst + (chunk * BlockN + smem_row) * ptx::kSw128RowBytes, m, coords, full_barrier);
    }
  };
  // The pages of the boxes that hold keys, read together (one memory latency, not one per box), unless given.
  TilePages<BlockN> pages;  // a copy, not a reference chosen at run time: that would put both in memory
  if (paged) {
    if (pages_read != nullptr)
      pages = *pages_read;
    else
      pages.read(p, batch, key0, valid);
  }
  // Key `key` of the sequence (in a box that holds keys): its row and outer (batch or page) coordinates.
  auto at = [&](int box, int32_t key, auto&& load) {
    if (paged)
      load(int32_t(p.page_divmod.mod(uint32_t(key))), pages.page_of(box));
    else
      load(geo.k_row0 + key, batch_coord);
  };
#pragma unroll 1  // the producer's code stays small: it shares the instruction cache with the consumers
  for (int box = 0; box < kMaxBoxes; ++box) {
    const int32_t r = box * box_rows;
    if (r >= BlockN) break;
    if (r >= valid) {  // no key: zeros
      issue(map, r, -box_rows, 0);
    } else if (r + box_rows <= valid || map16 == nullptr) {  // keys only, or K's last box
      at(box, key0 + r, [&](int32_t row, int32_t outer) { issue(map, r, row, outer); });
    } else {  // V's last box: its keys in 16-row and 1-row boxes, then zeros
      int32_t q = r;
#pragma unroll 1
      for (; q + 16 <= valid; q += 16) at(box, key0 + q, [&](int32_t row, int32_t outer) { issue(map16, q, row, outer); });
#pragma unroll 1
      for (; q < valid; ++q) at(box, key0 + q, [&](int32_t row, int32_t outer) { issue(map1, q, row, outer); });
#pragma unroll 1
      for (; q % 16 != 0; ++q) issue(map1, q, -1, 0);
#pragma unroll 1
      for (; q < r + box_rows; q += 16) issue(map16, q, -16, 0);
    }
  }
}

// F32 (FA4_AB_PAGED_V_WARP, config.hpp): whether a call's V tiles are issued by v_load_role, the producer
// warpgroup's second warp (paged calls of the instances with per-sequence geometry), not by load_role.
template <bool Varlen>
__device__ __forceinline__ bool paged_v_warp(const FwdParams& p) {
  if constexpr (FA4_AB_PAGED_V_WARP && Varlen)
    return p.page_table != nullptr;
  else
    return false;
}

// F32: the V tiles of a paged call, from the producer warpgroup's second warp. It reads every tile slot load_role
// publishes (one more release per slot: the tile ring's count in fwd_kernel), walks the same tiles and key blocks
// with its own V stage state (the consumers take K and V of a block at one stage index, and both rings step once
// per block), and reads its pages itself.
template <int Row>
__device__ __forceinline__ void v_load_role(const FwdParams& p, FwdSharedStorage<Row>& smem) {
  using Config = FwdConfig<Row>;
  if (!ptx::elect_one_sync()) return;
  if (p.seqlen_k > 0) ptx::prefetch_tensormap(&p.v_map);  // as load_role: unencoded without keys
  const FwdRing<Row, Config::kStages> v_ring(smem.v_ring);
  const FwdRing<Row, kTileRingStages> tile_ring(smem.tile_ring);
  auto stage = cuda::producer_start_state<Config::kStages>();
  auto tile_stage = cuda::consumer_start_state<kTileRingStages>();
  for (;;) {
    tile_ring.consumer_wait(tile_stage);
    const int32_t linear = smem.tile_slot[tile_stage.index];
    tile_ring.consumer_release(tile_stage);
    ++tile_stage;
    if (linear >= p.order.num_tiles()) return;
    const WorkTile tile = p.order.tile(linear);
    const SeqGeometry geo = seq_geometry(p, tile);
    const KvTileRange range = kv_tile_range_in_sequence<Config::kBlockM, Config::kBlockN>(p, tile, geo);
    if (range.empty()) continue;  // load_role loads nothing for it either
    const int32_t kv_head = tile.head / p.group;
    for (int32_t n_block = range.begin; n_block < range.end; ++n_block, ++stage) {
      TilePages<Config::kBlockN> pages;  // read before the stage wait, so the wait hides its latency (F9)
      pages.read(p, geo, tile.batch, n_block);
      v_ring.producer_acquire(stage);
      v_ring.producer_expect_tx(stage, Config::kKvTileBytes);
      load_kv_tile_in_sequence<Config::kHeadDim, Config::kBlockN>(
          smem.v[stage.index], p, geo, &p.v_map, &p.v_map16, &p.v_map1, kv_head * p.v_head_step, tile.batch,
          tile.batch * p.v_batch_step, n_block, v_ring.full_barrier(stage), &pages);
    }
  }
}

// Per tile: publish the tile index; then (unless no key is visible to any of its rows) the first K, Q (once the
// consumers have released the previous Q), the first V, and the remaining K/V pairs. The first K goes before Q so
// that it streams while the consumers finish the previous tile.
// Varlen: a tile's rows and keys start at its sequence's offsets in the packed tensors (mapped as batch 1).
template <int Row, bool Varlen>
__device__ __forceinline__ void load_role(const FwdParams& p, FwdSharedStorage<Row>& smem) {
  using Config = FwdConfig<Row>;
  constexpr int HeadDim = Config::kHeadDim;
  using Ring = FwdRing<Row, Config::kStages>;
  if (!ptx::elect_one_sync()) return;
  trace::Recorder rec(FA4_TRACE_SINK(p), kFwdTraceLoadWriter, true);

  ptx::prefetch_tensormap(&p.q_map);
  if (p.seqlen_k > 0) {  // else the K/V maps were never encoded (and no K/V tile is ever loaded)
    ptx::prefetch_tensormap(&p.k_map);
    ptx::prefetch_tensormap(&p.v_map);
  }

  const Ring k_ring(smem.k_ring), v_ring(smem.v_ring);
  const bool v_elsewhere = paged_v_warp<Varlen>(p);  // F32's define: a paged call's V is the second warp's
  const FwdRing<Row, 1> q_ring(smem.q_ring);
  const FwdRing<Row, kTileRingStages> tile_ring(smem.tile_ring);
  auto kv_stage = cuda::producer_start_state<Config::kStages>();
  auto q_stage = cuda::producer_start_state<1>();
  auto tile_stage = cuda::producer_start_state<kTileRingStages>();
  const TileScheduler<Varlen> scheduler(p);
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
    SeqGeometry geo;  // varlen / KV cache: the tile's sequence
    if constexpr (Varlen) {  // tile_kv_range spelled out: through it the dense producer's SASS changes (d = 128)
      geo = seq_geometry(p, tile);
      range = kv_tile_range_in_sequence<Config::kBlockM, Config::kBlockN>(p, tile, geo);
    } else {
      range = kv_tile_range<Config::kBlockM, Config::kBlockN>(p, tile);
    }
    if (range.empty()) continue;  // the consumers write zeros without waiting for anything
    const int32_t kv_head = tile.head / p.group;
    // One K or V tile into its ring (K and V rings step together, on kv_stage).
    TilePages<Config::kBlockN> pages;  // the current K/V tile's pages (paged caches)
    auto load_kv = [&](const Ring& ring, uint8_t (&tiles)[Config::kStages][Config::kKvTileBytes],
                       const CUtensorMap* map, const CUtensorMap* map16, const CUtensorMap* map1, int32_t head_step,
                       int32_t batch_step, int32_t n_block, decltype(kv_stage) stage) {
      if constexpr (Varlen)
        if (map16 == nullptr) pages.read(p, geo, tile.batch, n_block);  // K's load comes first: read for both
      FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::stage_free);
      ring.producer_acquire(stage);
      FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::stage_free);
      ring.producer_expect_tx(stage, Config::kKvTileBytes);
      if constexpr (Varlen) {
        load_kv_tile_in_sequence<HeadDim, Config::kBlockN>(tiles[stage.index], p, geo, map, map16, map1,
                                                           kv_head * head_step, tile.batch, tile.batch * batch_step,
                                                           n_block, ring.full_barrier(stage),
                                                           &pages);
      } else {
        (void)map16, (void)map1;
        load_tile<HeadDim, Config::kBlockN>(tiles[stage.index], map, n_block * Config::kBlockN, kv_head * head_step,
                                            tile.batch * batch_step, ring.full_barrier(stage));
      }
    };
    auto load_k = [&](int32_t n_block, decltype(kv_stage) stage) {
      load_kv(k_ring, smem.k, &p.k_map, nullptr, nullptr, p.k_head_step, p.k_batch_step, n_block, stage);
      FA4_TRACE_RECORD(rec, trace::Kind::tma_issue, trace::Operand::k);
    };
    auto load_v = [&](int32_t n_block, decltype(kv_stage) stage) {
      if (v_elsewhere) return;  // v_load_role's
      load_kv(v_ring, smem.v, &p.v_map, &p.v_map16, &p.v_map1, p.v_head_step, p.v_batch_step, n_block, stage);
      FA4_TRACE_RECORD(rec, trace::Kind::tma_issue, trace::Operand::v);
    };
    auto load_q = [&] {
      q_ring.producer_acquire(q_stage);
      q_ring.producer_expect_tx(q_stage, Config::kQTileBytes);
      int32_t q_row = geo.q_row0 + tile.m_block * Config::kBlockM;
      // FA4_AB_TOP_PAD: kernel rows start m_shift rows above q's; TMA fills the rows outside the tensor with zeros.
      if constexpr (kTopPad && !Varlen) q_row -= p.m_shift;
      load_tile<HeadDim, Config::kBlockM>(smem.q, &p.q_map, q_row,
                                          tile.head * p.q_head_step, tile.batch * p.q_batch_step,
                                          q_ring.full_barrier(q_stage));
      FA4_TRACE_RECORD(rec, trace::Kind::tma_issue, trace::Operand::q);
      ++q_stage;
    };
    // K first: Q's stage frees only at the previous tile's last S.
    load_k(range.begin, kv_stage);
    load_q();
    load_v(range.begin, kv_stage);
    ++kv_stage;
    for (int32_t n_block = range.begin + 1; n_block < range.end; ++n_block, ++kv_stage) {
      load_k(n_block, kv_stage);
      load_v(n_block, kv_stage);
    }
  }
}

}  // namespace fa4::sm90
