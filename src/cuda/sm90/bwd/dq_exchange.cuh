// The backward CTA pair's dQ exchange (FA4_BWD_CLUSTER=1, docs/sm90-backward.md): each warpgroup slab of a
// query tile is summed half by half, one half in each CTA, and each CTA reduce-adds its half, so one slab's
// worth of atomics per pair and tile reaches L2. Three adder warps run it: the dQ writer warp (adder 0: takes the
// staged slabs, issues every bulk operation) and the producer warpgroup's otherwise idle warps 2 and 3 (adders
// 1, 2: their share of the adds). Per tile:
//   every adder takes each staged slab on its dq_full barrier (dq_reduce.cuh: so every adder's reads are ordered
//     after the consumers' writes by a barrier it passed itself); the writer pushes the peer's half of each
//     slab into the peer's dq_incoming as soon as it is staged (bulk copy, completing the peer's
//     dq_incoming_full);
//   per slab: all wait for the half the peer pushed, add it into this CTA's half, meet again; the writer tells
//     the peer (dq_pushed_consumed: that incoming buffer is read, and with it the peer's pushed half) and
//     reduce-adds the summed half;
//   once the reduces have read the buffers and the peer has added the halves pushed to it, every adder lane
//     hands the buffers back (dq_empty counts all 96 of them).
// One adder warp was too slow (perf-log B8: the writer warp at 24 registers set the pace, consumers waited a third
// of their time for the buffer).
#pragma once

#include <cstdint>

#include "cuda/pipeline/pipeline_state.hpp"
#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/named_barrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/bwd/dq_reduce.cuh"
#include "cuda/sm90/bwd/params.hpp"
#include "cuda/sm90/bwd/shared_storage.cuh"
#include "cuda/sm90/bwd/work.cuh"
#include "cuda/trace/recorder.cuh"

namespace fa4::sm90 {

// Every lane of the warp arrives on warpgroup c's dq_empty of the buffer after its own reads of it (the barrier
// counts 32, or kDqAdderThreads with the exchange).
template <int Row>
__device__ __forceinline__ void dq_hand_back(BwdSharedStorage<Row>& smem, int c, int buffer = 0) {
  __syncwarp();
  ptx::mbarrier_arrive(&smem.scratch.dq_empty[buffer][c]);
}

template <int Row>
class DqPairExchange {
 public:
  using Config = BwdConfig<Row>;
  static constexpr uint32_t kHalfFloats = Config::kDqHalfBytes / 4;
  static_assert(Config::kDqHalfBytes % 16 == 0, "the adders take 16-byte vectors");

  // adder: 0 for the dQ writer warp (leader: its elected lane), 1 and 2 for the helpers.
  __device__ DqPairExchange(BwdSharedStorage<Row>& smem, uint32_t rank, int adder, bool leader)
      : smem_(smem), rank_(rank), peer_(rank ^ 1u), adder_(adder), issuer_(adder == 0 && leader) {}

  // One query tile. slab_of(c) (the writer's) is the workspace unit of warpgroup c's slab, whose half `rank`
  // this CTA adds.
  template <class SlabOf>
  __device__ void tile(cuda::PipelineState<1> phase, SlabOf&& slab_of, trace::Recorder& rec, int32_t m_block) const {
#pragma unroll 1
    for (int c = 0; c < Config::kConsumerWarpgroups; ++c) {
      // The three adders take the slab from two call sites (the writer's and the helpers' instances of this
      // function): the non-aligned barrier.sync, after the warp has reconverged.
      FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::dq_buffer);
      __syncwarp();
      ptx::named_barrier_sync_any_site(dq_full_barrier(c, 0), kWarpgroupThreads + kDqAdderThreads);
      FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::dq_buffer);
      if (issuer_) {
        ptx::mbarrier_arrive_expect_tx(&smem_.scratch.dq_incoming_full[c], Config::kDqHalfBytes);
        ptx::bulk_copy_to_peer(ptx::peer_shared(smem_.scratch.dq_incoming[c], peer_),
                               smem_.scratch.dq_staging[c] + peer_ * kHalfFloats, Config::kDqHalfBytes,
                               ptx::peer_shared(&smem_.scratch.dq_incoming_full[c], peer_));
      }
    }
    // 512 float4 per half over 96 threads: the first 32 indices take one vector more. The helpers take those
    // (the writer warp comes last), since the writer also issues every bulk operation.
    const uint32_t thread = uint32_t((adder_ + kDqAdderWarps - 1) % kDqAdderWarps) * 32 + threadIdx.x % 32;
#pragma unroll 1
    for (int c = 0; c < Config::kConsumerWarpgroups; ++c) {
      float* own_half = smem_.scratch.dq_staging[c] + rank_ * kHalfFloats;
      const float* incoming = smem_.scratch.dq_incoming[c];
      FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::peer);
      ptx::mbarrier_wait_parity_cluster(&smem_.scratch.dq_incoming_full[c], phase.phase);  // the peer's bytes
      FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::peer);
#pragma unroll 2
      for (uint32_t i = thread * 4; i < kHalfFloats; i += kDqAdderThreads * 4) {
        float4 a = *reinterpret_cast<const float4*>(own_half + i);
        const float4 b = *reinterpret_cast<const float4*>(incoming + i);
        a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
        *reinterpret_cast<float4*>(own_half + i) = a;
      }
      ptx::fence_proxy_async_shared_cta();  // the sums, before the bulk reduce (async proxy) reads them
      meet();
      if (issuer_) {
        ptx::mbarrier_arrive_peer(ptx::peer_shared(&smem_.scratch.dq_pushed_consumed[c], peer_));
        ptx::bulk_reduce_add(slab_of(c) + rank_ * kHalfFloats, own_half, Config::kDqHalfBytes);
        ptx::tma_store_commit();
        FA4_TRACE_RECORD(rec, trace::Kind::dq_add, m_block);
      }
    }
    if (issuer_) ptx::tma_store_wait_read<0>();  // before its lane's hand-back: the buffers are read
    FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::peer);
#pragma unroll 1
    for (int c = 0; c < Config::kConsumerWarpgroups; ++c) {
      ptx::mbarrier_wait_parity_cluster(&smem_.scratch.dq_pushed_consumed[c], phase.phase);  // a peer's release
      dq_hand_back(smem_, c);
    }
    FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::peer);
  }

 private:
  // Reached from two call sites too (the writer's and the helpers' instances): the non-aligned form, as for
  // dq_full (the aligned bar.sync failed synccheck on the H100, "divergent threads" in the writer warp, perf-log
  // B13).
  __device__ static void meet() {
    __syncwarp();
    ptx::named_barrier_sync_any_site(static_cast<uint32_t>(BwdBarrier::dq_adders), kDqAdderThreads);
  }

  BwdSharedStorage<Row>& smem_;
  uint32_t rank_, peer_;
  int adder_;
  bool issuer_;
};

// Warps 2 and 3 of the producer warpgroup with the exchange on: adders 1 and 2, over the CTA's walk.
template <int Row>
__device__ __forceinline__ void bwd_dq_adder_role(const BwdParams& p, BwdSharedStorage<Row>& smem, int adder) {
  using Config = BwdConfig<Row>;
  trace::Recorder rec(FA4_TRACE_SINK(p), 0, false);  // helpers record nothing
  const DqPairExchange<Row> exchange(smem, ptx::cluster_ctarank(), adder, false);
  auto phase = cuda::consumer_start_state<1>();
  auto no_unit = [](int) { return static_cast<float*>(nullptr); };
  for_each_work_item<Config::kBlockM, Config::kBlockN, /*Varlen=*/false>(p, [&](const BwdWork& work) {
    for (TileWalk walk(p, work); walk.more(); walk.next(p, work), ++phase) exchange.tile(phase, no_unit, rec, walk.m_block);
  });
}

}  // namespace fa4::sm90
