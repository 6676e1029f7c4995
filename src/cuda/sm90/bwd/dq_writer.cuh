// Backward dQ writer role (key-split rows): warp 1 of the producer warpgroup, and in deterministic mode warp 2 as
// well (writer w takes the walk's tiles t with t % 2 == w). For each of its query tiles (the consumers' order) and
// every consumer warpgroup: waits until the warpgroup's slab is staged (dq_full of that writer), adds it to the
// workspace's fp32 dQ accumulator with one bulk reduce-add (cp.reduce.async.bulk .add.f32, one elected lane),
// waits until the reduce has read the staging buffer and hands it back (dq_empty, an mbarrier every lane of the
// writer arrives on). Deterministic mode: before each add, waits for the slab's turn; after every warpgroup's add
// of the tile, waits until they are performed and passes the turns on. With one writer that wait (an L2 round
// trip of the reduce, ~1.5 µs) and the next tile's turn wait were serial, and the consumers waited for their
// buffer 46% of the time (perf-log B12); two writers overlap them. The consumers never wait for a turn, only for
// their buffer.
#pragma once

#include <cstdint>
#include <cuda/atomic>

#include "cuda/pipeline/pipeline_state.hpp"

#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/elect.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/named_barrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/bwd/dq_exchange.cuh"
#include "cuda/sm90/bwd/dq_reduce.cuh"
#include "cuda/sm90/bwd/shared_storage.cuh"
#include "cuda/sm90/bwd/work.cuh"
#include "cuda/sm90/trace_writers.hpp"
#include "cuda/trace/recorder.cuh"

namespace fa4::sm90 {

template <int Row, bool Varlen>
__device__ __forceinline__ void bwd_dq_writer_role(const BwdParams& p, BwdSharedStorage<Row>& smem, int writer) {
  using Config = BwdConfig<Row>;
  static_assert(!Config::kColumnSplit, "column-split rows add dQ from registers");
  // The slabs this warp takes alone (the pair's exchange takes them with its helpers: DqPairExchange::tile).
  constexpr uint32_t kHandoffThreads = kWarpgroupThreads + 32;
  // With register adds the consumers add their slabs themselves.
  if (p.dq_register_adds || p.det_register_adds) return;
  const bool leader = ptx::elect_one_sync();
  trace::Recorder rec(FA4_TRACE_SINK(p), kBwdTraceDqWriter, leader && writer == 0);  // writer 0's events only
  auto take_slab = [&](int c) {  // waits until warpgroup c's slab is staged
    FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::dq_buffer);
    ptx::named_barrier_sync(dq_full_barrier(c, writer), kHandoffThreads);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::dq_buffer);
  };
  // Deterministic mode without the pair on rows with two staging buffers: this writer's own (dq_stager's order).
  const int buffer = dq_staging_buffers<Config>(p) == 2 ? writer : 0;
  auto staging = [&](int c) { return dq_staging_buffer(smem, buffer, c); };
  auto hand_back = [&](int c) { dq_hand_back(smem, c, buffer); };
  // The CTA pair's dQ exchange (dq_exchange.cuh): this warp takes the slabs and issues every bulk operation;
  // the producer warpgroup's idle warps help with the adds (bwd_dq_adder_role).
  const bool exchange_dq = dq_exchanged(p);
  const DqPairExchange<Row> pair_exchange(smem, exchange_dq ? ptx::cluster_ctarank() : 0u, 0, leader);
  auto exchange = cuda::consumer_start_state<1>();  // one phase of each exchange barrier per query tile
  const int writers = dq_writers(p);
  int turn_of_writer = 0;  // which writer takes the walk's current tile (the consumers stage in the same turn)
  for_each_work_item<Config::kBlockM, Config::kBlockN, Varlen>(p, [&](const auto& work) {
    // The accumulator unit of warpgroup c's slab of query tile m_block.
    auto slab_of = [&](int64_t row_base, int32_t m_block, int c) {
      return key_split_slab_unit<Config>(p, dq_chain_of(p, work), row_base, m_block, c);
    };
    for (TileWalk walk(p, work); walk.more(); walk.next(p, work)) {
      const int32_t h = walk.head, m_block = walk.m_block;
      const int64_t row_base = work.template ws_row_base<Config::kBlockM>(p, h);
      const bool mine = turn_of_writer == writer;
      turn_of_writer = turn_of_writer + 1 == writers ? 0 : turn_of_writer + 1;
      if (!mine) continue;
      if (exchange_dq) {
        pair_exchange.tile(exchange, [&](int c) { return slab_of(row_base, m_block, c); }, rec, m_block);
        ++exchange;
        continue;
      }
      if (!p.deterministic) {
#pragma unroll 1
        for (int c = 0; c < Config::kConsumerWarpgroups; ++c) {
          take_slab(c);
          if (leader) {
            ptx::bulk_reduce_add(slab_of(row_base, m_block, c), staging(c), Config::kDqStagingBytes);
            ptx::tma_store_commit();
            FA4_TRACE_RECORD(rec, trace::Kind::dq_add, m_block);
            ptx::tma_store_wait_read<0>();  // the staging buffer is read; the adds complete in the background
          }
          hand_back(c);
        }
        continue;
      }
      // Deterministic: every warpgroup's slab (each with its own counter, all with the same turn) is added before
      // one wait for the adds to be performed, so a tile costs the writer one round trip to L2, not one per slab.
      const int32_t turn = dq_turn_of<Config::kBlockM, Config::kBlockN>(p, work, h, m_block);
#pragma unroll 1
      for (int c = 0; c < Config::kConsumerWarpgroups; ++c) {
        take_slab(c);
        if (leader) {
          ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> counter(
              dq_turn_counter<Config>(p, dq_chain_of(p, work), row_base, m_block, c));
          FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::dq_turn);
          wait_for_turn(counter, turn);
          FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::dq_turn);
          ptx::fence_proxy_async_global();  // the acquire above, before the async-proxy add below
          if (p.det_store_first && turn == 0)  // the chain's first slab of the tile: nothing to add it to
            ptx::bulk_store(slab_of(row_base, m_block, c), staging(c), Config::kDqStagingBytes);
          else
            ptx::bulk_reduce_add(slab_of(row_base, m_block, c), staging(c), Config::kDqStagingBytes);
          ptx::tma_store_commit();
          FA4_TRACE_RECORD(rec, trace::Kind::dq_add, m_block);
        }
        __syncwarp();  // the warp reaches the next barrier converged (bar.sync is .aligned)
      }
      // The buffers go back as soon as the reduces have read them; the turns pass on once the adds are performed.
      if (leader) ptx::tma_store_wait_read<0>();
#pragma unroll 1
      for (int c = 0; c < Config::kConsumerWarpgroups; ++c) hand_back(c);
      if (leader) {
        auto pass_turn = [&](int c) {
          ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device>(
              dq_turn_counter<Config>(p, dq_chain_of(p, work), row_base, m_block, c))
              .fetch_add(1, ::cuda::memory_order_release);
        };
        static_assert(Config::kConsumerWarpgroups <= 2, "the early pass waits for all but the last slab's group");
        if (p.det_slab_release && Config::kConsumerWarpgroups == 2) {
          // Each slab's turn passes on as soon as its own add is performed (the bulk groups complete in order):
          // the next key block's add of slab 0 overlaps this block's add of slab 1.
          ptx::tma_store_wait<1>();
          ptx::fence_proxy_async_global();
          pass_turn(0);
          ptx::tma_store_wait<0>();
          ptx::fence_proxy_async_global();
          pass_turn(1);
        } else {
          ptx::tma_store_wait<0>();         // the adds are performed (global memory written) ...
          ptx::fence_proxy_async_global();  // ... and ordered, async proxy before generic, with the releases
#pragma unroll 1
          for (int c = 0; c < Config::kConsumerWarpgroups; ++c) pass_turn(c);
        }
      }
      __syncwarp();  // converged before the next tile's barriers
    }
  });
  if (leader) ptx::tma_store_wait<0>();  // before the CTA exits: the last adds are performed
  FA4_TRACE_FINISH(rec);
}

}  // namespace fa4::sm90
