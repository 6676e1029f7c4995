// Backward MMA role of a consumer warpgroup (block_n / 64 per CTA, 64 keys each). Per query tile of the walk:
//   issues Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (SS wgmma, two commit groups; 64 keys × block_m queries each),
//   Pᵀ = exp2(Sᵀ·scale·log2e − LSE₂) once Sᵀ lands (masked elements 0; LSE₂ = +inf gives 0 for padding and
//     fully masked rows), with softcap x = cap·tanh(s·scale/cap) and its derivative 1 − tanh² kept for dS,
//   dSᵀ = Pᵀ ∘ (dPᵀ − D) once dPᵀ lands (the softmax scale is applied once, to dK here and to dQ later),
//   issues dV += Pᵀ·dO and dK += dSᵀ·Q (RS wgmma, P and dS packed to 16 bits straight from the registers),
//   writes dSᵀ to shared memory, and once every warpgroup has (ds_ready) issues its slab of dQ = dS·K before
//   dK, stages the slab for the dQ writer warp (dq_reduce.cuh, dq_writer.cuh) while dK runs, then releases the
//   stage (with the CTA pair, also the peer's, whose producer filled half of it).
// dK and dV of the warpgroup's keys stay in registers over every query head of the group and every tile.
#pragma once

#include <cstdint>

#include "cuda/pipeline/pipeline.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/named_barrier.cuh"
#include "cuda/ptx/swizzle.hpp"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/bwd/dq_reduce.cuh"
#include "cuda/sm90/bwd/epilogue.cuh"
#include "cuda/sm90/bwd/shared_storage.cuh"
#include "cuda/sm90/bwd/softmax_grad.cuh"
#include "cuda/sm90/bwd/work.cuh"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/trace_writers.hpp"
#include "cuda/trace/recorder.cuh"

namespace fa4::sm90 {

// Issues this warpgroup's slab of dQ = dS·K over block_n / 16 k-steps (one commit group). Both operands are
// read MN-major: dSᵀ [query chunk][keys][128 B] gives A = dS with the queries contiguous; K [d chunk][keys][128 B]
// gives B with the head dim contiguous. The slab is units u0 .. u0 + units - 1 of the tile's (block_m/64) ×
// (head_dim/64) units: query chunk u0 / (head_dim/64), head-dim chunks from u0 % (head_dim/64).
template <ptx::WgmmaInput In, int Row>
__device__ __forceinline__ void issue_dq(ptx::WgmmaAccumulator<BwdConfig<Row>::kDqN>& dq, uint32_t ds_tile,
                                         uint32_t k_tile, int consumer) {
  using Config = BwdConfig<Row>;
  constexpr uint32_t kChunkBytes = uint32_t(Config::kBlockN) * ptx::kSw128RowBytes;
  const int u0 = consumer * Config::kDqUnitsPerWarpgroup;
  const uint32_t a_base = ds_tile + uint32_t(u0 / Config::kHeadDimChunks) * kChunkBytes;
  const uint32_t b_base = k_tile + uint32_t(u0 % Config::kHeadDimChunks) * kChunkBytes;
  ptx::wgmma_fence_operand(dq);
  ptx::wgmma_fence();  // dSᵀ was written by ordinary stores (and fenced to the async proxy)
  const auto a0 = ptx::sw128_mn_major_desc(a_base, kChunkBytes), b0 = ptx::sw128_mn_major_desc(b_base, kChunkBytes);
#pragma unroll
  for (int kb = 0; kb < Config::kBlockN / 16; ++kb)
    ptx::wgmma_ss<In, ptx::Major::mn, ptx::Major::mn>(dq, a0.advanced(kb * 2048u), b0.advanced(kb * 2048u),
                                                      /*accumulate=*/kb > 0);
  ptx::wgmma_commit_group();
}

// The warpgroup's walk over a work item's query tiles; on return dK (unscaled) and dV hold its keys' gradients.
// The Q ring's state, the dQ stager and the dSᵀ buffer in turn run on from item to item (a persistent grid).
template <ptx::WgmmaInput In, int Row, class Work>
__device__ __forceinline__ void bwd_mma_walk(const BwdParams& p, BwdSharedStorage<Row>& smem, const Work& work,
                                             int consumer, ptx::WgmmaAccumulator<BwdConfig<Row>::kHeadDim>& dk,
                                             ptx::WgmmaAccumulator<BwdConfig<Row>::kHeadDim>& dv,
                                             cuda::PipelineState<BwdConfig<Row>::kStages>& stage,
                                             DqStager<Row>& dq_stager, int& ds_buffer, trace::Recorder& rec) {
  using Config = BwdConfig<Row>;
  constexpr int HeadDim = Config::kHeadDim, BlockM = Config::kBlockM, BlockN = Config::kBlockN;
  constexpr int kKSteps = BlockM / 16;
  constexpr uint32_t kKvChunkBytes = uint32_t(BlockN) * ptx::kSw128RowBytes;
  using Scores = ptx::WgmmaAccumulator<BlockM>;  // Sᵀ, dPᵀ: 64 keys × block_m queries

  const int thread = threadIdx.x % kWarpgroupThreads;
  const int64_t key0 = int64_t(work.n_block) * BlockN + consumer * kWgmmaM + ptx::accumulator_row(thread, 0);
  const int64_t key[2] = {key0, key0 + 8};
  const int col_base = 2 * (thread % 4);
  const uint32_t k_rows = smem_address(smem.k) + uint32_t(consumer) * kWgmmaM * ptx::kSw128RowBytes;
  const uint32_t v_rows = smem_address(smem.v) + uint32_t(consumer) * kWgmmaM * ptx::kSw128RowBytes;

  const BwdRing<Row, Config::kStages> q_ring(smem.q_ring);
  for (TileWalk walk(p, work); walk.more(); walk.next(p, work)) {
    const int32_t h = walk.head, m_block = walk.m_block;
    const int64_t row_base = work.template ws_row_base<BlockM>(p, h);  // the head's dQ accumulator rows
    FA4_TRACE_RECORD(rec, trace::Kind::tile_begin, m_block);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::q);
    q_ring.consumer_wait(stage);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::q);
    const uint32_t q_tile = smem_address(smem.q[stage.index]), dout_tile = smem_address(smem.dout[stage.index]);
    Scores s, dp;
    issue_qk<In, HeadDim, BlockM>(s, k_rows, kKvChunkBytes, q_tile);
    issue_qk<In, HeadDim, BlockM>(dp, v_rows, kKvChunkBytes, dout_tile);
    FA4_TRACE_RECORD(rec, trace::Kind::s_issue, m_block);
    const bool masked = !tile_pair_fully_visible<BlockM, BlockN>(work.mask(p), m_block, work.n_block);
    softmax_grad_tile<BlockM>(p, work, s, dp, smem.lse_log2[stage.index], smem.dsum[stage.index], key,
                              int64_t(m_block) * BlockM, col_base, masked, rec, m_block);
    FA4_TRACE_RECORD(rec, trace::Kind::softmax_end, m_block);

    ptx::WgmmaFragmentA p_frag[kKSteps], ds_frag[kKSteps];
#pragma unroll
    for (int kb = 0; kb < kKSteps; ++kb) p_frag[kb] = ptx::fragment_a_from_accumulator<In>(s, kb);
    issue_pv<In, HeadDim, BlockM>(dv, p_frag, dout_tile);  // dV += Pᵀ·dO
    FA4_TRACE_RECORD(rec, trace::Kind::pv_issue, m_block);
    uint8_t* ds_tile = smem.ds[ds_buffer];
#pragma unroll
    for (int kb = 0; kb < kKSteps; ++kb) ds_frag[kb] = ptx::fragment_a_from_accumulator<In>(dp, kb);
    store_fragments16<BlockN>(ds_tile, ds_frag, consumer * kWgmmaM, 0);  // dSᵀ, packed once for both uses
    ptx::fence_proxy_async_shared_cta();  // the dSᵀ stores, before the dQ wgmmas (async proxy) read them
    FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::barrier);
    ptx::named_barrier_sync(static_cast<uint32_t>(BwdBarrier::ds_ready),
                            Config::kConsumerWarpgroups * kWarpgroupThreads);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::barrier);
    // dQ before dK (FA3's order): the commit groups complete in order, so once dV and dQ are done the slab is
    // staged while dK still runs on the tensor core, instead of after all three.
    ptx::WgmmaAccumulator<Config::kDqN> dq;
    issue_dq<In, Row>(dq, smem_address(ds_tile), smem_address(smem.k), consumer);
    issue_pv<In, HeadDim, BlockM>(dk, ds_frag, q_tile);  // dK += dSᵀ·Q
    ptx::wgmma_wait_group<1>();  // dV and dQ landed; dK may still run
    ptx::wgmma_fence_operand(dv);
    ptx::wgmma_fence_operand(dq);
#pragma unroll
    for (int kb = 0; kb < kKSteps; ++kb) ptx::wgmma_fence_operand(p_frag[kb]);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::dq_buffer);
    if (p.dq_register_adds || p.det_register_adds)  // red.global.add.v4 from the registers (turn: the helper's)
      key_split_register_add<Config>(p, work, dq, row_base, h, m_block, consumer);
    else
      dq_stager.stage(p, dq);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::dq_buffer);
    ptx::wgmma_wait_group<0>();
    FA4_TRACE_RECORD(rec, trace::Kind::pv_done, m_block);
    ptx::wgmma_fence_operand(dk);
#pragma unroll
    for (int kb = 0; kb < kKSteps; ++kb) ptx::wgmma_fence_operand(ds_frag[kb]);
    // Every thread releases the stage itself (dK read Q until now): each has read LSE₂ and D with ordinary
    // loads, and racecheck pairs a read with the producer's next bulk copy only through the reading thread's
    // own arrival (lane 0 releasing for its warp after a barrier was reported as a race; perf-log B21 measured
    // it again: 8 racecheck hazard groups per warp release, 5bff966).
    q_ring.consumer_release(stage);
    if (Config::kPairCapable && !Work::kVarlen && p.cluster_pair) {  // the peer's producer wrote half: one per warp
      __syncwarp();
      // Relaxed: the peer wrote only Q/dO halves, which the wgmmas above have finished reading (perf-log B25).
      if (threadIdx.x % 32 == 0) q_ring.consumer_release_peer_after_reads(stage, ptx::cluster_ctarank() ^ 1u);
    }
    ++stage;
    FA4_TRACE_RECORD(rec, trace::Kind::tile_end, m_block);
    ds_buffer ^= 1;
  }
}

// A key-split consumer warpgroup over the CTA's work items: per item, its keys' walk (bwd_mma_walk), then dK and
// dV stored (epilogue.cuh), then the K/V stage released for the next item's load (after the epilogue: it may
// stage dK and dV in the K/V tiles).
template <ptx::WgmmaInput In, int Row, bool Varlen>
__device__ __forceinline__ void bwd_key_split_consumer(const BwdParams& p, BwdSharedStorage<Row>& smem, int consumer) {
  using Config = BwdConfig<Row>;
  trace::Recorder rec(FA4_TRACE_SINK(p), bwd_trace_consumer_writer(consumer), threadIdx.x % kWarpgroupThreads == 0);
  const BwdRing<Row, 1> kv_ring(smem.kv_ring);
  auto kv_stage = cuda::consumer_start_state<1>();
  auto stage = cuda::consumer_start_state<Config::kStages>();
  DqStager<Row> dq_stager(smem, p, consumer);
  int ds_buffer = 0;
  for_each_work_item<Config::kBlockM, Config::kBlockN, Varlen>(p, [&](const auto& work) {
    ptx::WgmmaAccumulator<Config::kHeadDim> dk, dv;
#pragma unroll
    for (int i = 0; i < Config::kHeadDim / 2; ++i) dk.reg[i] = dv.reg[i] = 0.0f;
    if (!work.empty()) {
      kv_ring.consumer_wait(kv_stage);
      bwd_mma_walk<In, Row>(p, smem, work, consumer, dk, dv, stage, dq_stager, ds_buffer, rec);
    }
    FA4_TRACE_RECORD(rec, trace::Kind::epilogue_begin, work.n_block);
    bwd_epilogue_role<In, Config::kHeadDim>(p, work, int64_t(work.n_block) * Config::kBlockN + consumer * kWgmmaM, 0,
                                            dk, dv, smem.k, smem.v, Config::kBlockN, consumer,
                                            Config::kConsumerWarpgroups);
    FA4_TRACE_RECORD(rec, trace::Kind::epilogue_end, work.n_block);
    if (!work.empty()) {
      kv_ring.consumer_release(kv_stage);  // every consumer thread (the ring counts them)
      ++kv_stage;
    }
  });
  dq_stager.finish();  // nothing to wait for when it staged nothing (register adds)
  FA4_TRACE_FINISH(rec);
}

}  // namespace fa4::sm90
