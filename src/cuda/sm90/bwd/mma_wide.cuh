// Backward consumer role of the column-split rows (head dims 192 and 256, bwd/config.hpp): both warpgroups share
// the CTA's 64 keys; warpgroup c owns `Chunks` head-dim chunks of 64 from first_chunk, and queries 32c .. 32c + 31
// of every 64-query tile. Per query tile of the walk:
//   Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for its 32 queries (SS wgmma, N = 32, two commit groups),
//   Pᵀ and dSᵀ (softmax_grad.cuh), written as 16-bit into the tile's shared Pᵀ and dSᵀ buffers; once both
//     warpgroups have (ds_ready), with all operands in shared memory:
//   dQ[64 queries][own chunks] = dS·K (A = dSᵀ read MN-major, B = K MN-major), its own commit group, issued first
//     so the adds of dQ (red.global.add from registers, dq_reduce.cuh) overlap the next two,
//   dV[keys][own chunks] += Pᵀ·dO and dK += dSᵀ·Q (A K-major from the Pᵀ/dSᵀ buffers, B MN-major),
//   then releases the stage. Pᵀ and dSᵀ alternate between two buffers each: ds_ready of tile t + 1 comes after
//   both warpgroups' waits for tile t's GEMMs, so tile t + 2 may overwrite tile t's buffers.
// dK, dV of the owned chunks stay in registers over the whole walk; the epilogue stores them.
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

// acc (+)= A·B over KSteps k-steps of 16, both operands in shared memory, one commit group. A is MajorA (a_step:
// bytes per k-step), B is MN-major [chunks][rows][128 B] (a k-step of 16 rows is 2048 bytes; its 64-column
// chunks b_chunk_bytes apart).
template <ptx::WgmmaInput In, ptx::Major MajorA, int KSteps, int N>
__device__ __forceinline__ void issue_ss_mn_b(ptx::WgmmaAccumulator<N>& acc, uint32_t a, uint32_t a_step,
                                              uint32_t a_chunk_bytes, uint32_t b, uint32_t b_chunk_bytes,
                                              bool accumulate) {
  const auto a0 = MajorA == ptx::Major::k ? ptx::sw128_k_major_desc(a) : ptx::sw128_mn_major_desc(a, a_chunk_bytes);
  const auto b0 = ptx::sw128_mn_major_desc(b, b_chunk_bytes);
#pragma unroll
  for (int kb = 0; kb < KSteps; ++kb)
    ptx::wgmma_ss<In, MajorA, ptx::Major::mn>(acc, a0.advanced(kb * a_step), b0.advanced(kb * 2048u),
                                              accumulate || kb > 0);
  ptx::wgmma_commit_group();
}

// Over the CTA's work items (a persistent grid's, or its one): per item the walk, the epilogue, and the K/V stage
// released for the next item's load (after the epilogue, which may stage dK and dV in the K/V tiles). The Q ring's
// state and the Pᵀ/dSᵀ buffer in turn run on over the items.
template <ptx::WgmmaInput In, int Row, int Chunks, bool Varlen>
__device__ __forceinline__ void bwd_wide_consumer(const BwdParams& p, BwdSharedStorage<Row>& smem, int consumer,
                                                  int first_chunk) {
  using Config = BwdConfig<Row>;
  constexpr int HeadDim = Config::kHeadDim, BlockM = Config::kBlockM, BlockN = Config::kBlockN;
  constexpr int kQueries = Config::kScoreQueries, N = Chunks * 64;
  constexpr uint32_t kKvChunkBytes = uint32_t(BlockN) * ptx::kSw128RowBytes;
  constexpr uint32_t kQChunkBytes = uint32_t(BlockM) * ptx::kSw128RowBytes;
  static_assert(Config::kColumnSplit && BlockN == kWgmmaM, "the warpgroups share one 64-key block");
  using Scores = ptx::WgmmaAccumulator<kQueries>;  // Sᵀ, dPᵀ: 64 keys × this warpgroup's 32 queries

  const int thread = threadIdx.x % kWarpgroupThreads;
  trace::Recorder rec(FA4_TRACE_SINK(p), bwd_trace_consumer_writer(consumer), thread == 0);
  const int col0 = first_chunk * 64;
  const int col_base = 2 * (thread % 4);
  const int query_half = consumer * kQueries;
  const uint32_t k_tile = smem_address(smem.k), v_tile = smem_address(smem.v);
  const BwdRing<Row, 1> kv_ring(smem.kv_ring);
  auto kv_stage = cuda::consumer_start_state<1>();
  const BwdRing<Row, Config::kStages> q_ring(smem.q_ring);
  auto stage = cuda::consumer_start_state<Config::kStages>();
  const DqRegisterAdder<Row> dq_adder(consumer, first_chunk);
  int buffer = 0;
  for_each_work_item<BlockM, BlockN, Varlen>(p, [&](const auto& work) {
    ptx::WgmmaAccumulator<N> dk, dv;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) dk.reg[i] = dv.reg[i] = 0.0f;
    const int64_t first_key = int64_t(work.n_block) * BlockN;
    if (!work.empty()) {
      const int64_t key0 = first_key + ptx::accumulator_row(thread, 0);
      const int64_t key[2] = {key0, key0 + 8};
      kv_ring.consumer_wait(kv_stage);
      for (TileWalk walk(p, work); walk.more(); walk.next(p, work)) {
        const int32_t h = walk.head, m_block = walk.m_block;
        const int64_t row_base = work.template ws_row_base<BlockM>(p, h);
        FA4_TRACE_RECORD(rec, trace::Kind::tile_begin, m_block);
        FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::q);
        q_ring.consumer_wait(stage);
        FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::q);
        const uint32_t q_tile = smem_address(smem.q[stage.index]), dout_tile = smem_address(smem.dout[stage.index]);
        const uint32_t half_rows = uint32_t(query_half) * ptx::kSw128RowBytes;
        Scores s, dp;
        issue_qk<In, HeadDim, kQueries>(s, k_tile, kKvChunkBytes, q_tile + half_rows, kQChunkBytes);
        issue_qk<In, HeadDim, kQueries>(dp, v_tile, kKvChunkBytes, dout_tile + half_rows, kQChunkBytes);
        FA4_TRACE_RECORD(rec, trace::Kind::s_issue, m_block);
        const bool masked = !tile_pair_fully_visible<BlockM, BlockN>(work.mask(p), m_block, work.n_block);
        softmax_grad_tile<kQueries>(p, work, s, dp, smem.lse_log2[stage.index] + query_half,
                                    smem.dsum[stage.index] + query_half, key,
                                    int64_t(m_block) * BlockM + query_half, col_base, masked, rec, m_block);
        FA4_TRACE_RECORD(rec, trace::Kind::softmax_end, m_block);
        uint8_t* pt_tile = smem.scratch.pt[buffer];
        uint8_t* ds_tile = smem.ds[buffer];
        store_tile16<In, kQueries, BlockN>(pt_tile, s, 0, query_half);
        store_tile16<In, kQueries, BlockN>(ds_tile, dp, 0, query_half);
        ptx::fence_proxy_async_shared_cta();  // the stores, before the wgmmas (async proxy) read them
        // The warpgroups are different instances of this function (their chunk counts): the barrier is reached
        // from two instructions.
        FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::barrier);
        ptx::named_barrier_sync_any_site(static_cast<uint32_t>(BwdBarrier::ds_ready),
                                         Config::kConsumerWarpgroups * kWarpgroupThreads);
        FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::barrier);

        ptx::WgmmaAccumulator<N> dq;
        ptx::wgmma_fence_operand(dq);
        ptx::wgmma_fence_operand(dv);
        ptx::wgmma_fence_operand(dk);
        ptx::wgmma_fence();
        // dQ = dS·K: A = dSᵀ [keys][queries] read MN-major (a k-step is 16 key rows), B = K's owned chunks.
        issue_ss_mn_b<In, ptx::Major::mn, BlockN / 16>(dq, smem_address(ds_tile), 2048u, kKvChunkBytes,
                                                       k_tile + uint32_t(first_chunk) * kKvChunkBytes,
                                                       kKvChunkBytes, false);
        // dV += Pᵀ·dO, dK += dSᵀ·Q: A K-major (a k-step is 16 queries, 32 bytes of each key row).
        issue_ss_mn_b<In, ptx::Major::k, BlockM / 16>(dv, smem_address(pt_tile), 32u, 0u,
                                                      dout_tile + uint32_t(first_chunk) * kQChunkBytes, kQChunkBytes,
                                                      true);
        issue_ss_mn_b<In, ptx::Major::k, BlockM / 16>(dk, smem_address(ds_tile), 32u, 0u,
                                                      q_tile + uint32_t(first_chunk) * kQChunkBytes, kQChunkBytes,
                                                      true);
        FA4_TRACE_RECORD(rec, trace::Kind::pv_issue, m_block);
        ptx::wgmma_wait_group<2>();  // dQ landed; dV and dK may still run
        ptx::wgmma_fence_operand(dq);
        FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::dq_turn);  // deterministic: the turn; else the reds' issue
        dq_adder.add(p, work, dq, row_base, h, m_block);
        FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::dq_turn);
        FA4_TRACE_RECORD(rec, trace::Kind::dq_add, m_block);
        ptx::wgmma_wait_group<0>();
        ptx::wgmma_fence_operand(dv);
        ptx::wgmma_fence_operand(dk);
        FA4_TRACE_RECORD(rec, trace::Kind::pv_done, m_block);
        q_ring.consumer_release(stage);  // every thread: its LSE₂/D reads and the GEMMs' Q/dO reads are done
        ++stage;
        buffer ^= 1;
        FA4_TRACE_RECORD(rec, trace::Kind::tile_end, m_block);
      }
    }
    FA4_TRACE_RECORD(rec, trace::Kind::epilogue_begin, work.n_block);
    bwd_epilogue_role<In, N>(p, work, first_key, col0, dk, dv, smem.k, smem.v, BlockN, consumer,
                             Config::kConsumerWarpgroups);
    FA4_TRACE_RECORD(rec, trace::Kind::epilogue_end, work.n_block);
    if (!work.empty()) {
      kv_ring.consumer_release(kv_stage);  // every consumer thread (the ring counts them)
      ++kv_stage;
    }
  });
  FA4_TRACE_FINISH(rec);
}

}  // namespace fa4::sm90
