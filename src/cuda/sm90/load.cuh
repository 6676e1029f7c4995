// Load role: one producer warp; one elected lane issues every TMA of the CTA. Q once (its own barrier), then
// for each visible K/V tile a K load into the K ring and a V load into the V ring, each stage acquired from the
// Pipeline (blocks while the consumers still read it) and armed with the exact byte count it will receive.
// A tile that runs past seqlen_k (or a Q tile past seqlen_q) is zero-filled by TMA; the bytes still count.
#pragma once

#include <cstdint>

#include "cuda/pipeline/pipeline.cuh"
#include "cuda/ptx/elect.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/shared_storage.cuh"

namespace fa4::sm90 {

// Issues the head_dim / 64 boxes of one [rows][head_dim] tile, each into its 128-byte-wide smem chunk.
template <int HeadDim, int Rows>
__device__ __forceinline__ void load_tile(uint8_t* smem_tile, const CUtensorMap* map, int32_t row, int32_t head,
                                          int32_t batch, uint64_t* full_barrier) {
#pragma unroll
  for (int chunk = 0; chunk < HeadDim / kSw128Columns; ++chunk) {
    const int32_t coords[4] = {chunk * kSw128Columns, row, head, batch};
    ptx::tma_load(smem_tile + chunk * Rows * ptx::kSw128RowBytes, map, coords, full_barrier);
  }
}

template <int HeadDim>
__device__ __forceinline__ void load_role(const FwdParams& p, FwdSharedStorage<HeadDim>& smem, const WorkTile& tile) {
  using Config = FwdConfig<HeadDim>;
  using Ring = cuda::Pipeline<Config::kStages>;
  const KvTileRange range = kv_tile_range<Config::kBlockM, Config::kBlockN>(p, tile.m_block);
  // Nothing visible: the consumers write zeros without waiting for anything, so nothing may be in flight.
  if (range.empty() || !ptx::elect_one_sync()) return;

  ptx::prefetch_tensormap(&p.q_map);
  ptx::prefetch_tensormap(&p.k_map);
  ptx::prefetch_tensormap(&p.v_map);

  ptx::mbarrier_arrive_expect_tx(&smem.q_full, Config::kQTileBytes);
  load_tile<HeadDim, Config::kBlockM>(smem.q, &p.q_map, tile.m_block * Config::kBlockM, tile.head * p.q_head_step,
                                      tile.batch * p.q_batch_step, &smem.q_full);

  const int32_t kv_head = tile.head / p.group;
  const Ring k_ring(smem.k_ring), v_ring(smem.v_ring);
  auto stage = cuda::producer_start_state<Config::kStages>();
  for (int32_t n_block = range.begin; n_block < range.end; ++n_block, ++stage) {
    const int32_t key0 = n_block * Config::kBlockN;
    k_ring.producer_acquire(stage);
    k_ring.producer_expect_tx(stage, Config::kKvTileBytes);
    load_tile<HeadDim, Config::kBlockN>(smem.k[stage.index], &p.k_map, key0, kv_head * p.k_head_step,
                                        tile.batch * p.k_batch_step, k_ring.full_barrier(stage));
    v_ring.producer_acquire(stage);
    v_ring.producer_expect_tx(stage, Config::kKvTileBytes);
    load_tile<HeadDim, Config::kBlockN>(smem.v[stage.index], &p.v_map, key0, kv_head * p.v_head_step,
                                        tile.batch * p.v_batch_step, v_ring.full_barrier(stage));
  }
}

}  // namespace fa4::sm90
