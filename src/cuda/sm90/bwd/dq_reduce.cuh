// dQ accumulation. Key-split rows: a consumer warpgroup stages its fp32 slab of a tile in shared memory
// (DqStager) and the dQ writer warp adds it to the workspace's accumulator with one bulk reduce-add
// (dq_writer.cuh). Column-split rows: each thread adds its registers with red.global.add.v4.f32
// (DqRegisterAdder). Deterministic mode: the slabs of one query tile are added in a fixed key-block order, from
// the last key block that visits the tile down to the first (dq_turn_of); the adder waits until the tile's turn
// counter (workspace dq_turn, one per query tile and warpgroup slab) reaches its key block's turn, adds, waits
// until the adds are performed, and passes the turn on (FA3's semaphore scheme). Key blocks are launched from the
// last one down, so a CTA only ever waits for CTAs launched before it; the rotated walk waits for blocks launched
// after it too, which its cooperative grid keeps resident (walk_order.hpp).
#pragma once

#include <cstdint>
#include <cuda/atomic>

#include "cuda/pipeline/pipeline_state.hpp"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/named_barrier.cuh"
#include "cuda/ptx/red.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/bwd/params.hpp"
#include "cuda/sm90/bwd/shared_storage.cuh"
#include "cuda/sm90/bwd/work.cuh"

namespace fa4::sm90 {

// Spins until the counter reaches `turn` (acquire); traps after FA4_MBARRIER_TIMEOUT_NS like the mbarrier
// waits, so a broken turn order fails loudly instead of hanging.
__device__ __forceinline__ void wait_for_turn(::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device>& counter,
                                              int32_t turn) {
  if (counter.load(::cuda::memory_order_acquire) == turn) return;
#if FA4_MBARRIER_TIMEOUT_NS > 0
  const uint64_t start = ::cuda::ptx::get_sreg_globaltimer();
  while (counter.load(::cuda::memory_order_acquire) != turn) {
    __nanosleep(32);
    if (::cuda::ptx::get_sreg_globaltimer() - start > static_cast<uint64_t>(FA4_MBARRIER_TIMEOUT_NS))
      ptx::mbarrier_timeout_trap();
  }
#else
  while (counter.load(::cuda::memory_order_acquire) != turn) __nanosleep(32);
#endif
}

// Deterministic mode's turn counter of (chain, query tile m_block, slot) of the (batch, head) whose workspace rows
// start at row_base (Work::ws_row_base): one per warpgroup slab of the tile.
template <class Config>
__device__ __forceinline__ int32_t& dq_turn_counter(const BwdParams& p, int32_t chain, int64_t row_base,
                                                    int32_t m_block, int slot) {
  return p.ws.dq_turn[chain * p.ws.dq_turn_copy_counters +
                      (row_base / Config::kBlockM + m_block) * Config::kConsumerWarpgroups + slot];
}

// The dQ accumulator unit at 64-row chunk row_chunk, 64-column chunk col_chunk of the (batch, head) whose
// workspace rows start at row_base, in the accumulator copy of turn chain `chain` (dq_chain_of; 0 outside
// deterministic mode).
template <class Config>
__device__ __forceinline__ float* dq_accum_unit(const BwdParams& p, int32_t chain, int64_t row_base,
                                                int64_t row_chunk, int col_chunk) {
  return p.ws.dq_accum + chain * p.ws.dq_accum_copy_floats +
         ((row_base / kDqUnitRows + row_chunk) * Config::kHeadDimChunks + col_chunk) * int64_t(kDqUnitFloats);
}

// The first accumulator unit of key-split warpgroup c's slab of query tile m_block (the slab is the warpgroup's
// kDqUnitsPerWarpgroup consecutive units: by query rows at d = 64, by head-dim columns at d = 128).
template <class Config>
__device__ __forceinline__ float* key_split_slab_unit(const BwdParams& p, int32_t chain, int64_t row_base,
                                                      int32_t m_block, int c) {
  const int first_unit = c * Config::kDqUnitsPerWarpgroup;
  const int64_t row_chunk = int64_t(m_block) * (Config::kBlockM / kDqUnitRows) + first_unit / Config::kHeadDimChunks;
  return dq_accum_unit<Config>(p, chain, row_base, row_chunk, first_unit % Config::kHeadDimChunks);
}

// Writes a warpgroup's dQ accumulator straight from its registers into accumulator units from `units` (this
// thread's float4 of the first unit): register group g (4 floats) of unit g / 8 lies at group g % 8 of that unit,
// base + 512 floats · g, so a warp's instruction covers 512 contiguous bytes. store: the values a reduce-add into
// zeroed memory would leave (subnormals flushed, -0 as +0), stored: the zeroed copies' bits; else reduce-added.
// One loop per case, chosen once: a choice per group compiled to a branch and a convergence barrier (BSSY/BSYNC)
// per group (perf-log B18).
template <int N>
__device__ __forceinline__ void write_accumulator_units(float* units, const ptx::WgmmaAccumulator<N>& dq,
                                                        bool store = false) {
  if (store) {
#pragma unroll
    for (int g = 0; g < N / 8; ++g)
      ptx::st_global_v4(units + g * kWarpgroupThreads * 4, ptx::flushed_plus_zero(dq.reg[4 * g]),
                        ptx::flushed_plus_zero(dq.reg[4 * g + 1]), ptx::flushed_plus_zero(dq.reg[4 * g + 2]),
                        ptx::flushed_plus_zero(dq.reg[4 * g + 3]));
  } else {
#pragma unroll
    for (int g = 0; g < N / 8; ++g)
      ptx::red_global_add_v4(units + g * kWarpgroupThreads * 4, dq.reg[4 * g], dq.reg[4 * g + 1], dq.reg[4 * g + 2],
                             dq.reg[4 * g + 3]);
  }
}

// The named barrier on which warpgroup `consumer` hands its staged slab to dQ writer `writer`.
__device__ __forceinline__ uint32_t dq_full_barrier(int consumer, int writer) {
  return static_cast<uint32_t>(BwdBarrier::first_dq_full) + uint32_t(consumer + kBwdMaxConsumerWarpgroups * writer);
}

// The dQ writer warps of a launch (key-split rows): the tiles of the walk go to them in turn.
__device__ __forceinline__ int dq_writers(const BwdParams& p) { return p.deterministic ? kBwdMaxDqWriters : 1; }

// The CTA pair's dQ exchange (dq_exchange.cuh) runs on three adder warps: the dQ writer warp and the producer
// warpgroup's warps 2 and 3. Every adder takes a staged slab on its dq_full barrier itself, so each one's reads
// of the buffer are ordered after the consumers' writes by a barrier it passed (compute-sanitizer's racecheck
// does not follow the order through a second barrier, perf-log B10/B11).
inline constexpr int kDqAdderWarps = 3;
inline constexpr uint32_t kDqAdderThreads = 32 * kDqAdderWarps;
__device__ __forceinline__ bool dq_exchanged(const BwdParams& p) { return p.cluster_pair && p.pair_dq_exchange; }

// Threads on a dq_full barrier: the consumer warpgroup and the warps that take its slab.
__device__ __forceinline__ uint32_t dq_handoff_threads(const BwdParams& p) {
  return kWarpgroupThreads + (dq_exchanged(p) ? kDqAdderThreads : 32u);
}

// Staging buffers per warpgroup in this launch: the row's two in deterministic mode without the CTA pair
// (p.det_two_buffers; buffer w for dQ writer w: the tiles go to the writers in turn), else one.
template <class Config>
__device__ __forceinline__ int dq_staging_buffers(const BwdParams& p) {
  // Deterministic mode is tested here too: the second buffers share memory with the pair's dq_incoming.
  return Config::kDetStagingBuffers == 2 && p.det_two_buffers && p.deterministic && !p.cluster_pair ? 2 : 1;
}
template <int Row>
__device__ __forceinline__ float* dq_staging_buffer(BwdSharedStorage<Row>& smem, int buffer, int c) {
  if constexpr (BwdConfig<Row>::kDetStagingBuffers == 1) return smem.scratch.dq_staging[c];
  return buffer == 0 ? smem.scratch.dq_staging[c] : smem.scratch.dq_staging_second[c];
}

// Consumer side of a key-split warpgroup's dQ: its fp32 slab of the tile goes to a staging buffer in the
// accumulator order (float4 per register group and thread: contiguous, conflict-free), and a dQ writer warp
// (dq_writer.cuh) adds it to the workspace. dq_full (a named barrier of the warpgroup's 128 threads and the
// writer's 32, or the pair's three adder warps; one per writer, the slabs going to the writers in turn) hands
// the buffer over, dq_empty (an mbarrier of the writer's 32 lanes, each arriving after its own reads: the CTA
// pair's writer reads the buffer with ordinary loads) hands it back, so the warpgroup waits only when the writer
// still holds that buffer's previous slab. With one buffer, a deterministic writer waiting for a turn held it and
// with it the warpgroup's next tile (perf-log B12); with one per writer (dq_staging_buffers) the warpgroup stages
// for the other writer meanwhile.
template <int Row>
class DqStager {
 public:
  using Config = BwdConfig<Row>;
  __device__ DqStager(BwdSharedStorage<Row>& smem, const BwdParams& p, int consumer)
      : staging_(smem.scratch.dq_staging[consumer]),
        second_(dq_staging_buffer(smem, 1, consumer)),
        empty_(&smem.scratch.dq_empty[0][consumer]),
        full_(dq_full_barrier(consumer, 0)),
        two_buffers_(dq_staging_buffers<Config>(p) == 2) {}

  // p: with two writers (deterministic mode) the slabs go to them in turn, and with two buffers buffer w is
  // writer w's.
  __device__ void stage(const BwdParams& p, const ptx::WgmmaAccumulator<Config::kDqN>& dq) {
    const int thread = threadIdx.x % kWarpgroupThreads;
    float* const staging = take_buffer();  // the writer has read that buffer's previous slab
    // With det_store_first the slab may be stored, not added: staged as a reduce into zeroed memory would leave it.
    // One loop per case (a select per value cost 64 FADD + SEL per slab in the default mode too).
    auto write = [&](auto value) {
#pragma unroll
      for (int g = 0; g < Config::kDqN / 8; ++g)
        *reinterpret_cast<float4*>(staging + (g * kWarpgroupThreads + thread) * 4) =
            make_float4(value(dq.reg[4 * g]), value(dq.reg[4 * g + 1]), value(dq.reg[4 * g + 2]),
                        value(dq.reg[4 * g + 3]));
    };
    if (p.det_store_first)
      write([](float x) { return ptx::flushed_plus_zero(x); });
    else
      write([](float x) { return x; });
    ptx::fence_proxy_async_shared_cta();  // the writes, before the writer's bulk reduce (async proxy) reads them
    // The count is read from the kernel parameters (constant bank) where it is used.
    ptx::named_barrier_arrive(full_, dq_handoff_threads(p));
    // The other writer's barrier, one bit away (the flag is a kernel parameter: no register held for it).
    static_assert(kBwdMaxDqWriters == 2 && (kBwdMaxConsumerWarpgroups & (kBwdMaxConsumerWarpgroups - 1)) == 0 &&
                      static_cast<uint32_t>(BwdBarrier::first_dq_full) % (2 * kBwdMaxConsumerWarpgroups) == 0,
                  "dq_full_barrier(c, 1) == dq_full_barrier(c, 0) ^ kBwdMaxConsumerWarpgroups");
    if (dq_writers(p) == 2) full_ ^= uint32_t(kBwdMaxConsumerWarpgroups);
  }

  // After the walk: takes the writers' last hand-backs, so every arrival on dq_empty has its wait.
  __device__ void finish() {
    take_buffer();
    if (two_buffers_) take_buffer();
  }

 private:
  // Waits until the next buffer is free and returns it. Both states start as a producer's (parity 1): a buffer's
  // first use passes at once.
  __device__ float* take_buffer() {
    if (two_buffers_) {
      const int buffer = int(ring_.index);
      ptx::mbarrier_wait_parity<Config::kWaitSuspendHintNs>(empty_ + buffer * Config::kConsumerWarpgroups, ring_.phase);
      ++ring_;
      return buffer == 0 ? staging_ : second_;
    }
    ptx::mbarrier_wait_parity<Config::kWaitSuspendHintNs>(empty_, single_.phase);
    ++single_;
    return staging_;
  }

  float* staging_;
  float* second_;  // the second writer's buffer (two_buffers_)
  uint64_t* empty_;  // dq_empty[0][consumer]; buffer b's is kConsumerWarpgroups · b further
  uint32_t full_;  // the dq_full barrier of the writer that takes the next slab
  bool two_buffers_;
  cuda::PipelineState<2> ring_ = cuda::producer_start_state<2>();    // two buffers: buffer = ring_.index
  cuda::PipelineState<1> single_ = cuda::producer_start_state<1>();  // one buffer
};

// Deterministic column-split rows with p.det_turn_helpers (the default; FA4_BWD_DET_HELPER=0 is off) and key-split
// rows with p.det_register_adds: one helper warp per consumer warpgroup (producer warps kTurnHelperWarp + c) runs
// the turn protocol beside its walk.
inline constexpr int kTurnHelperWarp = 2;
static_assert(kTurnHelperWarp + kBwdMaxConsumerWarpgroups <= 4, "the turn helpers are warps of the producer warpgroup");
__device__ __forceinline__ uint32_t turn_granted_barrier(int consumer) {
  return static_cast<uint32_t>(BwdBarrier::first_turn_granted) + uint32_t(consumer);
}
__device__ __forceinline__ uint32_t adds_issued_barrier(int consumer) {
  return static_cast<uint32_t>(BwdBarrier::first_adds_issued) + uint32_t(consumer);
}

// The turn helper of consumer warpgroup `consumer`, per query tile of the walk: lane 0 waits until the tile's
// counter reaches this key block's turn (acquire), the warp grants it (turn_granted, with the warpgroup's 128
// threads), waits until the warpgroup has issued its reds (adds_issued), and lane 0 publishes them: one
// fence.acq_rel.gpu, cumulative over the barrier (CUTLASS's semaphore pattern), then a relaxed increment. The
// fence waits for the reds to be performed at L2 (~1-2 µs under the backward's load, the 2026-12-05 trace) on
// this warp, while the warpgroup computes the next tile.
template <int Row, bool Varlen>
__device__ __forceinline__ void bwd_dq_turn_helper_role(const BwdParams& p, int consumer) {
  using Config = BwdConfig<Row>;
  // Column-split rows: p.det_turn_helpers; key-split rows: their register adds have no inline turn variant.
  if (!(Config::kColumnSplit ? p.det_turn_helpers : p.det_register_adds)) return;
  const bool lane0 = threadIdx.x % 32 == 0;
  for_each_work_item<Config::kBlockM, Config::kBlockN, Varlen>(p, [&](const auto& work) {
    for (TileWalk walk(p, work); walk.more(); walk.next(p, work)) {
      const int32_t h = walk.head, m_block = walk.m_block;
      ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> counter(dq_turn_counter<Config>(
          p, dq_chain_of(p, work), work.template ws_row_base<Config::kBlockM>(p, h), m_block, consumer));
      if (lane0) wait_for_turn(counter, dq_turn_of<Config::kBlockM, Config::kBlockN>(p, work, h, m_block));
      __syncwarp();
      ptx::named_barrier_arrive(turn_granted_barrier(consumer), kWarpgroupThreads + 32);
      ptx::named_barrier_sync(adds_issued_barrier(consumer), kWarpgroupThreads + 32);
      if (lane0) {
        ::cuda::atomic_thread_fence(::cuda::memory_order_acq_rel, ::cuda::thread_scope_device);
        counter.fetch_add(1, ::cuda::memory_order_relaxed);
      }
      __syncwarp();
    }
  });
}

// A warpgroup's deterministic adds in the turn its helper warp waited for (bwd_dq_turn_helper_role): the helper's
// acquire, then turn_granted, orders them after the previous key block's; after adds_issued the helper publishes
// them, so no fence sits on the warpgroup's path.
template <int N>
__device__ __forceinline__ void write_in_granted_turn(float* units, const ptx::WgmmaAccumulator<N>& dq, bool store,
                                                      int consumer) {
  ptx::named_barrier_sync(turn_granted_barrier(consumer), kWarpgroupThreads + 32);
  write_accumulator_units(units, dq, store);
  ptx::named_barrier_arrive(adds_issued_barrier(consumer), kWarpgroupThreads + 32);
}

// A key-split warpgroup's dQ slab added from its registers (red.global.add.v4.f32 into the slab's accumulator
// units, 512 contiguous bytes per warp instruction): in the default mode at once (p.dq_register_adds); in
// deterministic mode (p.det_register_adds) in its turn, which its helper warp waited for and publishes after the
// adds_issued barrier (bwd_dq_turn_helper_role), the chain's first slab stored (p.det_store_first).
template <class Config, class Work>
__device__ __forceinline__ void key_split_register_add(const BwdParams& p, const Work& work,
                                                       const ptx::WgmmaAccumulator<Config::kDqN>& dq,
                                                       int64_t row_base, int32_t h, int32_t m_block, int consumer) {
  const int thread = threadIdx.x % kWarpgroupThreads;
  if (!p.deterministic) {
    write_accumulator_units(key_split_slab_unit<Config>(p, 0, row_base, m_block, consumer) + thread * 4, dq);
    return;
  }
  const bool store = p.det_store_first && dq_turn_of<Config::kBlockM, Config::kBlockN>(p, work, h, m_block) == 0;
  write_in_granted_turn(key_split_slab_unit<Config>(p, dq_chain_of(p, work), row_base, m_block, consumer) + thread * 4,
                        dq, store, consumer);
}

// dQ accumulation of a column-split warpgroup (its 64 queries × its head-dim chunks, straight from the
// registers): every thread adds its accumulator's register groups with red.global.add.v4.f32, 512 contiguous
// bytes per warp instruction (the workspace units are in accumulator order). No staging buffer, so the Q/dO
// ring keeps two stages at d = 256. Deterministic mode: thread 0 waits for the turn, the warpgroup adds, every
// thread fences its adds, and after the warpgroup barrier thread 0 passes the turn on (release).
// With p.det_turn_helpers the turn wait and the publication are the helper warp's (above).
template <int Row>
class DqRegisterAdder {
 public:
  using Config = BwdConfig<Row>;
  static_assert(Config::kColumnSplit && Config::kBlockM == kDqUnitRows, "one 64-row dQ chunk per query tile");
  __device__ DqRegisterAdder(int consumer, int first_chunk)
      : barrier_(static_cast<uint32_t>(BwdBarrier::first_warpgroup) + uint32_t(consumer)),
        consumer_(consumer),
        first_chunk_(first_chunk) {}

  template <int N, class Work>
  __device__ void add(const BwdParams& p, const Work& work, const ptx::WgmmaAccumulator<N>& dq, int64_t row_base,
                      int32_t h, int32_t m_block) const {
    const int thread = threadIdx.x % kWarpgroupThreads;
    if (!p.deterministic) {
      write_accumulator_units(dq_accum_unit<Config>(p, 0, row_base, m_block, first_chunk_) + thread * 4, dq);
      return;
    }
    const int32_t chain = dq_chain_of(p, work);
    float* units = dq_accum_unit<Config>(p, chain, row_base, m_block, first_chunk_) + thread * 4;
    // The chain's first slab of the tile is stored, not added (p.det_store_first: nothing was zeroed). The turn is
    // computed once, where it is needed (the helpers wait for it themselves).
    const int32_t turn =
        p.det_store_first || !p.det_turn_helpers ? dq_turn_of<Config::kBlockM, Config::kBlockN>(p, work, h, m_block) : 0;
    const bool store = p.det_store_first && turn == 0;
    if (p.det_turn_helpers) {
      write_in_granted_turn(units, dq, store, consumer_);
      return;
    }
    ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> counter(
        dq_turn_counter<Config>(p, chain, row_base, m_block, consumer_));
    if (thread == 0) wait_for_turn(counter, turn);
    ptx::named_barrier_sync(barrier_, kWarpgroupThreads);  // the acquire above, before every thread's adds
    write_accumulator_units(units, dq, store);
    __threadfence();
    ptx::named_barrier_sync(barrier_, kWarpgroupThreads);
    if (thread == 0) counter.fetch_add(1, ::cuda::memory_order_release);
  }

 private:
  uint32_t barrier_;
  int consumer_, first_chunk_;
};

}  // namespace fa4::sm90
