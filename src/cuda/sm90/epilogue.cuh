// Epilogue role of a consumer warpgroup: finish the row sums over the quad, O / l, round to the output dtype,
// store its 64 rows; LSE (natural log, fp32). A row with no visible key has l = 0: O = 0 and LSE = -inf
// (num::finalize_row). Rows past seqlen_q are never written.
// O goes through shared memory and a TMA store when the output is TMA-addressable (p.out_tma): the warpgroup
// writes its fragments into its 64 rows of the O staging tile (shared_storage.cuh: a tile of its own, or its
// rows of Q; 128B-swizzled, the image the store box reads), then one thread stores the head_dim/64 boxes; the
// store completes in the background while the next tile runs. Otherwise (an output stride that is not a
// multiple of 16 bytes), and for tiles with no visible key (zeros), each thread stores its column pairs.
#pragma once

#include <cstdint>

#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/named_barrier.cuh"
#include "cuda/ptx/swizzle.hpp"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/mma_softmax.cuh"
#include "cuda/sm90/params.hpp"
#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/split_combine.cuh"
#include "cuda/sm90/tiles.cuh"
#include "cuda/trace/recorder.cuh"
#include "numerics/online_softmax.hpp"

namespace fa4::sm90 {

// by_tma: stage and store by TMA (p.out_tma, and the tile had visible keys). release_q: O is staged in Q's rows;
// once the store has read them, this warpgroup releases Q to the producer. no_key: the tile saw no key, so its
// LSE is the sink itself (exactly: m = sink·log2e and back through ln 2 would be off by an ulp) or -inf.
// Varlen: rows are the tile's sequence's (its length bounds them; out and lse rows start at its offset), always
// by per-thread stores (a TMA box would run into the next sequence's rows); split only in a KV-cache call (dense
// queries, offset 0).
template <ptx::WgmmaInput In, int Row, bool Varlen>
__device__ __forceinline__ void epilogue_role(const FwdParams& p, const SeqGeometry& geo, FwdSharedStorage<Row>& smem,
                                              const WorkTile& tile, int consumer,
                                              ConsumerStages<FwdConfig<Row>::kStages>& st, bool by_tma,
                                              bool release_q, bool no_key,
                                              ptx::WgmmaAccumulator<FwdConfig<Row>::kHeadDim>& o, RowState& rows,
                                              trace::Recorder& rec) {
  using Config = FwdConfig<Row>;
  constexpr int HeadDim = Config::kHeadDim;
  constexpr int kBlockM = Config::kBlockM;
  const int thread = threadIdx.x % kWarpgroupThreads;
  const int local_row0 = ptx::accumulator_row(thread, 0);  // within the warpgroup's 64 rows
  const int64_t rows_begin = int64_t(tile.m_block) * kBlockM + consumer * kWgmmaM;
  const int64_t row0 = rows_begin + local_row0;
  const int col_base = 2 * (thread % 4);

  float inv_l[2], lse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const num::RowFinal fin = num::finalize_row(rows.m[h], quad_sum(rows.l[h]));
    inv_l[h] = fin.inv_l;
    lse[h] = no_key && p.sinks != nullptr ? p.sinks[tile.head * p.sinks_stride] : fin.lse;
    const int64_t r = row0 + 8 * h;
    if constexpr (Varlen) {  // the sequence's rows, from its offset in the packed lse [h, total_q] (batch stride 0)
      if (p.lse != nullptr && thread % 4 == 0 && r < geo.seqlen_q)
        p.lse[tile.batch * p.lse_stride_b + tile.head * p.lse_stride_h + (geo.q_row0 + r) * p.lse_stride_s] = lse[h];
    } else if constexpr (kTopPad) {  // kernel row r is q's row r − m_shift; the rows above q's row 0 are padding
      if (p.lse != nullptr && thread % 4 == 0 && r < p.seqlen_q && r >= p.m_shift)
        p.lse[tile.batch * p.lse_stride_b + tile.head * p.lse_stride_h + (r - p.m_shift) * p.lse_stride_s] = lse[h];
    } else {
      if (p.lse != nullptr && thread % 4 == 0 && r < p.seqlen_q)
        p.lse[tile.batch * p.lse_stride_b + tile.head * p.lse_stride_h + r * p.lse_stride_s] = lse[h];
    }
  }

  // Split-KV (dense queries: a dense batch or a KV-cache call): this key range's O / l and LSE in fp32, for the
  // combine kernel.
  if (p.o_partial != nullptr) {
    const int64_t partial_row0 =
        ((int64_t(tile.split) * p.order.batch + tile.batch) * p.order.heads_q + tile.head) * p.seqlen_q;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (thread % 4 == 0 && row0 + 8 * h < p.seqlen_q) p.lse_partial[partial_row0 + row0 + 8 * h] = lse[h];
#pragma unroll
    for (int i = 0; i < HeadDim / 2; i += 2) {
      const int h = reg_row_half(i);
      const int64_t r = row0 + 8 * h;
      if (r >= p.seqlen_q) continue;
      *reinterpret_cast<float2*>(p.o_partial + (partial_row0 + r) * HeadDim + col_base + reg_col_in_pair_block(i)) =
          make_float2(o.reg[i] * inv_l[h], o.reg[i + 1] * inv_l[h]);
    }
    return;
  }

  if (!Varlen && by_tma) {
    uint8_t* const staging = o_staging(smem, consumer);
    const uint32_t barrier = static_cast<uint32_t>(NamedBarrier::first_epilogue) + uint32_t(consumer);
    if constexpr (Config::kSeparateOStaging) {  // the previous tile's store may still be reading the staging rows
      FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::stage_free);
      if (thread == 0) ptx::tma_store_wait_read<0>();
      ptx::named_barrier_sync(barrier, kWarpgroupThreads);
      FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::stage_free);
    }
    // O / l in place, then one stmatrix.x4 per warp and 16 columns: HeadDim / 16 stores per thread instead of
    // HeadDim / 4 four-byte ones, the same rounding and bytes (perf-log F38: +0-3% at 512-4k on the H100).
#pragma unroll
    for (int i = 0; i < HeadDim / 2; ++i) o.reg[i] *= inv_l[reg_row_half(i)];
    store_tile16<In, HeadDim, kBlockM>(staging, o, 0, 0);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::barrier);
    ptx::fence_proxy_async_shared_cta();  // the generic writes above, before the async-proxy store reads them
    ptx::named_barrier_sync(barrier, kWarpgroupThreads);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::barrier);
    // Thread 0 is the trace's writer: the event marks a real store. FA4_AB_TOP_PAD: kernel row r is q's row
    // r − m_shift, so a box may start above q's row 0 (the padded first tile): TMA stores it too (rows outside the
    // tensor are not written); a box wholly above it is not stored.
    auto store_o = [&](int64_t first_row) {
      FA4_TRACE_RECORD(rec, trace::Kind::tma_issue, trace::Operand::out);
#pragma unroll
      for (int chunk = 0; chunk < HeadDim / kSw128Columns; ++chunk) {
        const int32_t coords[4] = {chunk * kSw128Columns, int32_t(first_row), tile.head, tile.batch};
        ptx::tma_store(&p.out_map, coords, staging + chunk * kBlockM * ptx::kSw128RowBytes);
      }
      ptx::tma_store_commit();
    };
    if constexpr (kTopPad) {
      if (thread == 0 && rows_begin < p.seqlen_q && rows_begin + kWgmmaM > p.m_shift) store_o(rows_begin - p.m_shift);
    } else {
      if (thread == 0 && rows_begin < p.seqlen_q) store_o(rows_begin);
    }
    if (release_q) {
      if (thread == 0) ptx::tma_store_wait_read<0>();
      ptx::named_barrier_sync(barrier, kWarpgroupThreads);
      release_per_warp(FwdRing<Row, 1>(smem.q_ring), st.q);
    }
    return;
  }

  uint16_t* const out = static_cast<uint16_t*>(p.out) + tile.batch * p.out_stride_b + tile.head * p.out_stride_h;
  const auto store_pair = [&](uint16_t* dst, uint32_t pair) {
    if (p.out_pairs_aligned) {
      *reinterpret_cast<uint32_t*>(dst) = pair;
    } else {
      dst[0] = static_cast<uint16_t>(pair & 0xFFFFu);
      dst[1] = static_cast<uint16_t>(pair >> 16);
    }
  };
#pragma unroll
  for (int i = 0; i < HeadDim / 2; i += 2) {
    const int h = reg_row_half(i);
    const int64_t r = row0 + 8 * h;
    if constexpr (Varlen) {  // out's batch stride is 0: the row is the sequence's offset + r
      if (r >= geo.seqlen_q) continue;
    } else if constexpr (kTopPad) {  // kernel row r is q's row r − m_shift; the rows above q's row 0 are padding
      if (r >= p.seqlen_q || r < p.m_shift) continue;
    } else {
      if (r >= p.seqlen_q) continue;
    }
    const uint32_t pair = ptx::pack_rn<In>(o.reg[i] * inv_l[h], o.reg[i + 1] * inv_l[h]);
    if constexpr (Varlen)
      store_pair(out + (geo.q_row0 + r) * p.out_stride_s + col_base + reg_col_in_pair_block(i), pair);
    else if constexpr (kTopPad)
      store_pair(out + (r - p.m_shift) * p.out_stride_s + col_base + reg_col_in_pair_block(i), pair);
    else
      store_pair(out + r * p.out_stride_s + col_base + reg_col_in_pair_block(i), pair);
  }
}

// Split-KV merged in the cluster (p.cluster_combine): the cluster's CTAs are the num_splits ranges of one tile,
// `tile` (each CTA one range, its rank the range's index), and every consumer thread of each has written its
// partial rows. The cluster barrier (the producers take part too: kernel_fwd.cu) releases each thread's writes
// and acquires the others' at cluster scope, global memory included; then the consumer warps of the cluster merge
// the tile's rows: row r by CTA r % splits, its warps in turn.
template <ptx::WgmmaInput In, int Row>
__device__ __forceinline__ void merge_tile_in_cluster(const FwdParams& p, const WorkTile& tile, int consumer) {
  using Config = FwdConfig<Row>;
  constexpr int kWarps = Config::kConsumerWarpgroups * (kWarpgroupThreads / 32);
  ptx::cluster_sync();
  const int64_t first = int64_t(tile.m_block) * Config::kBlockM;
  const int64_t count = p.seqlen_q - first < Config::kBlockM ? p.seqlen_q - first : Config::kBlockM;
  const int64_t base = (int64_t(tile.batch) * p.order.heads_q + tile.head) * p.seqlen_q + first;  // unpacked row
  const int warp = consumer * (kWarpgroupThreads / 32) + (threadIdx.x % kWarpgroupThreads) / 32;
  const int64_t splits = p.order.num_splits;
  for (int64_t r = warp * splits + tile.split; r < count; r += kWarps * splits)
    merge_split_row<In == ptx::WgmmaInput::bf16>(p.combine, base + r, threadIdx.x % 32);
}

}  // namespace fa4::sm90
