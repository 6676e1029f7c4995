// A producer → consumer ring of `Stages` shared-memory buffers guarded by two mbarriers per stage:
//   full[s]   producer → consumers: stage s holds data (TMA: completes when the expected bytes have landed)
//   empty[s]  consumers → producer: every consumer is done reading stage s, it may be refilled
// Both sides walk the ring with a PipelineState; the phase bookkeeping lives there and nowhere else.
//
// TMA producer (one elected thread):           Plain-store producer (producer_arrivals threads):
//   pipe.producer_acquire(st);                   pipe.producer_acquire(st);
//   pipe.producer_expect_tx(st, bytes);          <st.shared into stage st.index>
//   tma_load(dst, map, xy, pipe.full_barrier(st)); pipe.producer_commit(st);
//   ++st;                                        ++st;
// Consumer (per consumer unit, e.g. a warpgroup):
//   pipe.consumer_wait(st);  <read stage st.index>;  pipe.consumer_release(st) [one thread per unit];  ++st;
#pragma once

#include <cstdint>

#include "cuda/pipeline/pipeline_state.hpp"
#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"

// A/B candidate (off by default): a ring's suspend hint on the producer's waits only (empty barriers); the
// consumers' waits poll without one. ncu of F45's default (d = 128, 16k) puts 3.4% of the stall samples on the
// consumers' hinted K/V waits, where the unhinted ones held 0.64% (perf-log F48).
#ifndef FA4_AB_HINT_PRODUCER_ONLY
#define FA4_AB_HINT_PRODUCER_ONLY 0
#endif

namespace fa4::cuda {

// The barriers of one ring, placed in the kernel's shared-storage struct.
template <int Stages>
struct PipelineBarriers {
  static_assert(Stages >= 1, "a ring needs at least one stage");
  alignas(8) uint64_t full[Stages];
  alignas(8) uint64_t empty[Stages];
};

// SuspendHintNs: the suspend-time hint of its waits (ptx::mbarrier_wait_parity; 0: none).
template <int Stages, uint32_t SuspendHintNs = 0>
class Pipeline {
 public:
  using State = PipelineState<Stages>;

  __device__ explicit Pipeline(PipelineBarriers<Stages>& barriers) : b_(barriers) {}

  // Called by exactly one thread of the CTA before any other use; afterwards every thread must pass a CTA-wide
  // barrier (__syncthreads) before touching the ring. producer_arrivals: arrivals that complete a fill (1 for a
  // TMA producer, whose bytes complete the rest; the number of storing threads for plain stores).
  // consumer_arrivals: releases that free a stage (one per consumer unit).
  __device__ static void init(PipelineBarriers<Stages>& barriers, uint32_t producer_arrivals,
                              uint32_t consumer_arrivals) {
    for (int s = 0; s < Stages; ++s) {
      ptx::mbarrier_init(&barriers.full[s], producer_arrivals);
      ptx::mbarrier_init(&barriers.empty[s], consumer_arrivals);
    }
    ptx::fence_barrier_init();
  }

  // Blocks until stage st.index may be overwritten (start the producer at producer_start_state()).
  __device__ void producer_acquire(State st) const {
    ptx::mbarrier_wait_parity<SuspendHintNs>(&b_.empty[st.index], st.phase);
  }

  // TMA path: the producer's arrival on full[st.index], plus the bytes the stage's TMA loads will deliver. Issue it
  // before (or together with) the loads that signal full_barrier(st); one thread per fill.
  __device__ void producer_expect_tx(State st, uint32_t bytes) const {
    ptx::mbarrier_arrive_expect_tx(&b_.full[st.index], bytes);
  }

  // Plain-store path: this thread's arrival on full[st.index], after its shared-memory writes to the stage
  // (release semantics make them visible to the consumers that observe the fill).
  __device__ void producer_commit(State st) const { ptx::mbarrier_arrive(&b_.full[st.index]); }

  // The barrier TMA loads of this stage signal (complete_tx).
  __device__ uint64_t* full_barrier(State st) const { return &b_.full[st.index]; }

  // Blocks until stage st.index has been filled (start consumers at consumer_start_state()).
  __device__ void consumer_wait(State st) const {
    ptx::mbarrier_wait_parity<FA4_AB_HINT_PRODUCER_ONLY ? 0u : SuspendHintNs>(&b_.full[st.index], st.phase);
  }

  // Non-blocking probe, for consumers that overlap the wait with other work.
  __device__ bool consumer_try_wait(State st) const {
    return ptx::mbarrier_try_wait_parity(&b_.full[st.index], st.phase);
  }

  // One arrival on empty[st.index]: this consumer unit has finished reading the stage.
  __device__ void consumer_release(State st) const { ptx::mbarrier_arrive(&b_.empty[st.index]); }

  // A ring shared by a cluster's CTAs (each producer multicasts into every CTA's stage): one arrival on the
  // empty barrier of the same stage in CTA `rank`, whose producer also writes this CTA's stage, from a consumer
  // that only read the stage and whose reads are complete (a wgmma wait): nothing to publish, so no cluster-scope
  // release (ptx/cluster.cuh; perf-log B25 measured the fenced arrival it replaced).
  __device__ void consumer_release_peer_after_reads(State st, uint32_t rank) const {
    ptx::mbarrier_arrive_peer_relaxed(ptx::peer_shared(&b_.empty[st.index], rank));
  }

 private:
  PipelineBarriers<Stages>& b_;
};

// A warp releases a stage as one consumer unit: one arrival (lane 0) after __syncwarp, so every lane is done
// with the stage. Rings whose units are warps count one consumer arrival per consumer warp at init.
template <int Stages, uint32_t SuspendHintNs>
__device__ __forceinline__ void release_per_warp(const Pipeline<Stages, SuspendHintNs>& ring,
                                                 PipelineState<Stages> st) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) ring.consumer_release(st);
}

}  // namespace fa4::cuda
