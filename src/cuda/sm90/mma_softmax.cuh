// MMA + softmax + correction role of a consumer warpgroup (block_m / 64 per CTA, 64 query rows each, sharing
// the K/V ring). Per visible K/V tile n the warpgroup, on its turn at the tensor core (TensorCoreTurn, round robin;
// a work tile's first S without a turn under FA4_FWD_PROLOGUE_TURN=0):
//   issues S = Q·Kₙᵀ (SS wgmma, both K-major) and O += P₍ₙ₋₁₎·V₍ₙ₋₁₎ (RS wgmma, P in registers, V MN-major),
//   hands the turn to the next warpgroup,
//   waits for S only (wgmma_wait_group<1>) and releases Kₙ,
//   softmax of S (intra-warpgroup overlap: runs while its own P·V is still on the tensor core):
//     x = score(S) in log2 units, masked to -inf; per-row block max over the quad (4 lanes hold a row);
//     correction decision: per-row conditional rescale (num::update_row_max with tau);
//     P = exp2(x - m): MUFU ex2.approx, or num::exp2_emulated for the key-column groups the policy sends to
//     the FMA pipe (bitwise the host's emulation); l += P (thread-local, quad-reduced once in the epilogue);
//   waits for P·V (wgmma_wait_group<0>) and releases V₍ₙ₋₁₎,
//   correction: O *= exp2(m_old - m_new) only if some row of the warp moved its max (most tiles skip it),
//   packs P to 16 bits (the A fragments of the next P·V, straight from the S registers).
// The first tile has no P·V before it, the last P·V no S after it (prologue / tail of the loop). The steady
// state's fully visible tiles (one run per work tile) take a body compiled for the common case (raw_max scores,
// no mask, MUFU only) when the call is in it; the other tiles the general body.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/pipeline/pipeline.cuh"
#include "cuda/ptx/elect.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/named_barrier.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/quad.cuh"
#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/tiles.cuh"
#include "cuda/trace/recorder.cuh"
#include "numerics/exp2.hpp"
#include "numerics/mask.hpp"
#include "numerics/online_softmax.hpp"

namespace fa4::sm90 {

// Per-thread softmax state of its two accumulator rows (r and r + 8 of the warpgroup's 64, fa3.md §3.5).
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};  // reference max, log2 units (may be stale by up to tau)
  float l[2] = {0.0f, 0.0f};            // this thread's share of sum exp2(x - m); quad-reduced in the epilogue
};

// A tile's rows before any key: empty, or with an attention sink (p.sinks) already seen as a key of value zero
// and logit `sink`: m = sink in log2 units, l = exp2(0) = 1 — on one lane of the quad, since the epilogue sums
// the quad's shares. A sink of -inf is no sink. The CPU backend starts its rows the same way (backend_fwd.cpp).
__device__ __forceinline__ RowState initial_rows(const FwdParams& p, int32_t head) {
  RowState rows;
  if (p.sinks == nullptr) return rows;
  const float m0 = p.sinks[head * p.sinks_stride] * num::kLog2e;
  if (m0 == -INFINITY) return rows;
  const float l0 = threadIdx.x % 4 == 0 ? 1.0f : 0.0f;
  rows.m[0] = rows.m[1] = m0;
  rows.l[0] = rows.l[1] = l0;
  return rows;
}

// Consumer releases: one arrival per consumer warp, each after its own wgmma wait (so no warp's view of the
// tile can still be in use), hence consumer_arrivals = 4 per consumer warpgroup at ring init.
inline constexpr uint32_t kReleasesPerConsumerWarpgroup = 4;

// Ping-pong between the Consumers consumer warpgroups, round robin: consumer c may issue GEMMs once consumer
// c − 1 has handed over. Per work tile: consumer 0 starts (the last consumer hands over once at the start). All
// walk the same K/V tiles, so they take the same number of turns; the tile's last hand-over (the last consumer
// to consumer 0, who has nothing left in this tile) is skipped, so each tile leaves every barrier balanced.
template <int Consumers>
class TensorCoreTurn {
 public:
  __device__ explicit TensorCoreTurn(int consumer) : consumer_(consumer) {}
  // A lone consumer has the tensor core to itself: every turn is a no-op (so are the turns of the rows the A/B
  // candidate FA4_AB_NO_TURNS names: FwdConfig::kTensorCoreTurns).
  __device__ void start() const {
    if constexpr (Consumers > 1)
      if (consumer_ == Consumers - 1) ptx::named_barrier_arrive(barrier(0), kThreads);
  }
  __device__ void wait() const {
    if constexpr (Consumers > 1) ptx::named_barrier_sync(barrier(consumer_), kThreads);
  }
  __device__ void hand_over(bool last_turn) const {
    if constexpr (Consumers > 1)
      if (!(last_turn && consumer_ == Consumers - 1))
        ptx::named_barrier_arrive(barrier((consumer_ + 1) % Consumers), kThreads);
  }

 private:
  static_assert(Consumers >= 1 && Consumers <= kMaxConsumerWarpgroups, "named barrier ids for 1 to 3 consumers");
  static constexpr uint32_t kThreads = 2 * kWarpgroupThreads;  // the waiting warpgroup + the handing-over one
  __device__ static uint32_t barrier(int consumer) {
    return static_cast<uint32_t>(NamedBarrier::first_turn) + uint32_t(consumer);
  }
  int consumer_;
};

// The correction decided by one tile's softmax, applied to O once O is no longer in a wgmma's hands.
struct Rescale {
  float factor[2] = {1.0f, 1.0f};
  bool any = false;  // warp-uniform: some row of this warp moved its reference max
#if FA4_TRACE
  int rows_moved = 0;  // trace builds: how many of the warp's 16 rows moved their max (the summary's per-row rate)
#endif
};

template <int HeadDim>
__device__ __forceinline__ void apply_rescale(ptx::WgmmaAccumulator<HeadDim>& o, const Rescale& r) {
  if (!r.any) return;
#pragma unroll
  for (int i = 0; i < HeadDim / 2; ++i) o.reg[i] *= r.factor[reg_row_half(i)];
}

// How the softmax reaches log2 units. raw_max (no softcap, scale > 0, the common case): the row max is taken
// on the raw scores and scaled once (rounding is monotone, so max(rn(s·c)) = rn(max(s)·c) bit for bit), and
// each MUFU argument is one FFMA s·c - m. transformed (softcap, or a scale <= 0): x = score(s) per element
// first. Emulated elements always see the host's argument rn(rn(x) - m), so they stay bitwise the host's.
enum class ScoreForm { raw_max, transformed };

__device__ __forceinline__ ScoreForm score_form(const FwdParams& p) {
  return !p.score.softcap && p.score.scale_log2 > 0.0f ? ScoreForm::raw_max : ScoreForm::transformed;
}

// Softmax of one S tile in place (S becomes P in fp32), for the thread's rows `row[2]` and the tile's keys
// starting at key0 (col_base: this thread's column-pair offset). Updates m and l; returns O's correction.
// Every policy test is warp-uniform and sits outside the per-element loops. Interior: the caller knows the tile
// is unmasked and p.exp2_emulated_per16 == 0, so neither path is compiled in (the steady state's fast body).
// Lean (FwdConfig::kLean; perf-log F46): the shorter path from S to the first exp2, marked below.
template <ScoreForm Form, int BlockN, bool Lean, bool Interior = false>
__device__ __forceinline__ Rescale softmax_tile(const FwdParams& p, const num::Mask& mask,
                                                ptx::WgmmaAccumulator<BlockN>& s, RowState& rows,
                                                const int64_t (&row)[2], int64_t key0, int col_base, bool masked) {
  static_assert(!Interior || Form == ScoreForm::raw_max, "the interior body is compiled for raw_max scores only");
  if constexpr (Form == ScoreForm::transformed) {
#pragma unroll
    for (int i = 0; i < BlockN / 2; ++i) s.reg[i] = p.score(s.reg[i]);
  }
  if (!Interior && masked) {  // masked elements (and keys past seqlen_k) to -inf, in either form
    // Per row half, the row's visible keys as offsets from this thread's first column (clamped to [-1, BlockN]:
    // the offsets reg_col_in_pair_block(i) lie in [0, BlockN)), so each element costs two 32-bit compares
    // against a constant instead of a 64-bit key and two 64-bit compares (as the backward's masked body).
    const int64_t base = key0 + col_base;
    auto clamp = [](int64_t x) { return int32_t(x < -1 ? -1 : (x > BlockN ? BlockN : x)); };
    int32_t lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lo[h] = clamp(mask.key_begin(row[h]) - base);
      hi[h] = clamp(mask.key_end(row[h]) - base);
    }
#pragma unroll
    for (int i = 0; i < BlockN / 2; ++i) {
      const int h = reg_row_half(i), col = reg_col_in_pair_block(i);
      if (!(col >= lo[h] && col < hi[h])) s.reg[i] = -INFINITY;
    }
  }
  const float c = Form == ScoreForm::raw_max ? p.score.scale_log2 : 1.0f;
  Rescale rescale;
  bool any_rescaled = false;
#if FA4_TRACE
  bool moved[2];
#endif
  // The two rows together (perf-log F41): each row's max as four partial maxima (eight chains of BlockN / 16 that
  // interleave, where one chain per row of BlockN / 4 ran the rows one after the other), their quad shuffles
  // issued together, and the correction decision by num::update_row_max, whose selects (it had branches) let the
  // compiler overlap the rows. The same bits: a max does not depend on order.
  // Correction: O is multiplied later, and only when some row of this warp moved its max.
  float block_max[2];
  {
    float part[2][4];
    if constexpr (Lean) {
      // Each chain starts from its first element (i = 4k + 2h), not from -inf: eight FMNMX fewer on the path
      // from S to the first exp2. The same bits unless every score of the row's tile is NaN (its max is then
      // NaN, not -inf; the row's output is NaN either way).
      static_assert(BlockN / 2 >= 16, "every (row half, chain) pair has an element among the first 16 registers");
#pragma unroll
      for (int i = 0; i < BlockN / 2; ++i) {
        float& acc = part[reg_row_half(i)][(i >> 2) & 3];
        acc = i < 16 && i % 2 == 0 ? s.reg[i] : fmaxf(acc, s.reg[i]);
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int k = 0; k < 4; ++k) part[h][k] = -INFINITY;
#pragma unroll
      for (int i = 0; i < BlockN / 2; ++i) {
        float& acc = part[reg_row_half(i)][(i >> 2) & 3];
        acc = fmaxf(acc, s.reg[i]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) block_max[h] = fmaxf(fmaxf(part[h][0], part[h][1]), fmaxf(part[h][2], part[h][3]));
  }
  quad_max_pair(block_max);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_old = rows.m[h];
    num::RowMaxUpdate u;
    if constexpr (Lean && Interior) {
      // A fully visible tile's block max is finite, so a row with no key before it (m_old = -inf) moves by the
      // rule's difference alone (+inf > tau; its factor exp2(-inf) = 0 scales an O and l of 0), and the exp2
      // subtrahend needs no safe_max below: a compare and two selects fewer per row on the path to the exp2s.
      // (Only infinite scores, outside the inputs' domain, could make it -inf: that row would be NaN, not 0.)
      const float bm = block_max[h] * c;
      u.rescaled = bm - m_old > p.rescale_threshold;
      u.m = u.rescaled ? bm : m_old;
    } else {
      u = num::update_row_max(m_old, Form == ScoreForm::raw_max ? block_max[h] * c : block_max[h],
                              p.rescale_threshold);
    }
    rows.m[h] = u.m;
    // m_old - u.m equals u.log2_scale wherever it is used; u.log2_scale itself costs a select more (d = 128
    // interior loop 545 instructions against 544).
    rescale.factor[h] = u.rescaled ? exp2_mufu(m_old - u.m) : 1.0f;
    any_rescaled = any_rescaled || u.rescaled;
#if FA4_TRACE
    moved[h] = u.rescaled;
#endif
    rows.l[h] *= rescale.factor[h];
  }
  rescale.any = __any_sync(0xffffffffu, any_rescaled);
#if FA4_TRACE
  const bool quad_lead = threadIdx.x % 4 == 0;  // the 4 lanes of a quad decide the same two rows
  rescale.rows_moved = __popc(__ballot_sync(0xffffffffu, quad_lead && moved[0])) +
                       __popc(__ballot_sync(0xffffffffu, quad_lead && moved[1]));
#endif

  // P = exp2(x - m), MUFU or emulated per the policy.
  constexpr bool kFiniteMax = Lean && Interior;  // the row max is finite here (above)
  const float m_sub[2] = {kFiniteMax ? rows.m[0] : num::safe_max(rows.m[0]),
                          kFiniteMax ? rows.m[1] : num::safe_max(rows.m[1])};
  const auto exp2_by_mufu = [&](int i) {  // element i on MUFU: one FFMA (raw_max) or FSUB for its argument
    const int h = reg_row_half(i);
    s.reg[i] = exp2_mufu(Form == ScoreForm::raw_max ? fmaf(s.reg[i], c, -m_sub[h]) : __fsub_rn(s.reg[i], m_sub[h]));
    rows.l[h] += s.reg[i];
  };
  if constexpr (Interior) {  // the caller's tiles have no emulated exp2 (and no else branch: no unreachable code)
#pragma unroll
    for (int i = 0; i < BlockN / 2; ++i) exp2_by_mufu(i);
  } else {
    if (p.exp2_emulated_per16 == 0) {
#pragma unroll
      for (int i = 0; i < BlockN / 2; ++i) exp2_by_mufu(i);
      return rescale;
    }
#pragma unroll
    for (int g = 0; g < BlockN / 8; ++g) {
      // Register group g = key columns key0 + 8g .. +7 for every lane: the emulation choice is warp-uniform.
      if (num::exp2_is_emulated(key0 + 8 * g, p.exp2_emulated_per16)) {
#pragma unroll
        for (int i = 4 * g; i < 4 * g + 4; ++i) {
          const int h = reg_row_half(i);
          // The host's argument: x rounded (never fused with the scale multiply), then x - m rounded.
          const float x = Form == ScoreForm::raw_max ? __fmul_rn(s.reg[i], c) : s.reg[i];
          s.reg[i] = num::exp2_emulated(__fsub_rn(x, m_sub[h]));
          rows.l[h] += s.reg[i];
        }
      } else {
#pragma unroll
        for (int i = 4 * g; i < 4 * g + 4; ++i) exp2_by_mufu(i);
      }
    }
  }
  return rescale;
}

// F49: a consumer warpgroup sits out the K/V tiles [first, last) of its work tile (fully masked for its rows: P
// would be 0): each stage released once full (a release before the fill could count toward the stage's previous
// phase) and each turn passed on, so the rings and the turn barriers stay balanced with the other warpgroups.
// Not inlined: inlined after the main loop, it made the d = 64 192-row loop spill its ring states (5 LDL and
// 2 STL more per step); the call costs a few instructions per work tile, once.
template <int Stages>
struct RingStates {
  cuda::PipelineState<Stages> k, v;
};
template <class Ring, class Turn, int Stages>
__device__ __noinline__ RingStates<Stages> sit_out(const Ring k_ring, const Ring v_ring, const Turn turn,
                                                   cuda::PipelineState<Stages> k, cuda::PipelineState<Stages> v,
                                                   int32_t first, int32_t last) {
  for (int32_t n = first; n < last; ++n) {
    k_ring.consumer_wait(k);
    turn.wait();
    turn.hand_over(/*last_turn=*/n == last - 1);
    release_per_warp(k_ring, k);
    ++k;
    v_ring.consumer_wait(v);
    release_per_warp(v_ring, v);
    ++v;
  }
  return {k, v};
}

// A consumer warpgroup's positions in the rings it reads; they carry over from one work tile to the next.
template <int Stages>
struct ConsumerStages {
  cuda::PipelineState<Stages> k = cuda::consumer_start_state<Stages>();
  cuda::PipelineState<Stages> v = cuda::consumer_start_state<Stages>();
  cuda::PipelineState<1> q = cuda::consumer_start_state<1>();
};

// The consumer warpgroup `consumer`'s main loop over a work tile's visible K/V tiles `range` (not empty). On
// return O holds the unnormalised output of this thread's rows and `rows` their (m, thread-local l). Q is
// released after the last S when release_q is set (F50: before the tail's P·V; else the epilogue releases it
// after staging O in it).
template <ptx::WgmmaInput In, int Row, bool Varlen>
__device__ __forceinline__ void mma_softmax_role(const FwdParams& p, const SeqGeometry& geo, FwdSharedStorage<Row>& smem,
                                                 const WorkTile& tile, const KvTileRange& range, int consumer,
                                                 ConsumerStages<FwdConfig<Row>::kStages>& st, bool release_q,
                                                 ptx::WgmmaAccumulator<FwdConfig<Row>::kHeadDim>& o, RowState& rows,
                                                 trace::Recorder& rec) {
  using Config = FwdConfig<Row>;
  constexpr int HeadDim = Config::kHeadDim;
  using Ring = FwdRing<Row, Config::kStages>;
  using S = ptx::WgmmaAccumulator<Config::kBlockN>;
  constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;
  constexpr int kKSteps = kBlockN / 16;

#pragma unroll
  for (int i = 0; i < HeadDim / 2; ++i) o.reg[i] = 0.0f;

  const int thread = threadIdx.x % kWarpgroupThreads;
  const int64_t row0 = int64_t(tile.m_block) * kBlockM + consumer * kWgmmaM + ptx::accumulator_row(thread, 0);
  const int64_t row[2] = {row0, row0 + 8};
  const int col_base = 2 * (thread % 4);
  // Config::kConsumerRanges (perf-log F49): this warpgroup stops at the end of its own rows' keys (own_end) and
  // sits out the range's later tiles (sit_out); otherwise own_end is the range's end.
  const num::Mask& call_mask = Varlen ? geo.mask : p.mask;
  const int32_t own_end =
      Config::kConsumerRanges
          ? rows_kv_end(call_mask, int64_t(tile.m_block) * kBlockM + consumer * kWgmmaM, kWgmmaM, kBlockN,
                        range.begin, range.end)
          : range.end;

  const uint32_t q_rows =
      static_cast<uint32_t>(__cvta_generic_to_shared(smem.q)) + uint32_t(consumer) * kWgmmaM * ptx::kSw128RowBytes;
  constexpr uint32_t kQChunkBytes = uint32_t(kBlockM) * ptx::kSw128RowBytes;
  // The K/V stage index made warp-uniform (ptx::warp_uniform): it is a loop-carried register the compiler does
  // not prove uniform, so each wgmma's descriptor was built in vector registers and copied (R2UR) per k-step; one
  // shuffle per stage address instead (perf-log F12).
  auto k_addr = [&](uint32_t stage) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(smem.k[ptx::warp_uniform(int(stage))]));
  };
  auto v_addr = [&](uint32_t stage) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(smem.v[ptx::warp_uniform(int(stage))]));
  };
  const ScoreForm form = score_form(p);
  auto softmax_with = [&](const num::Mask& mask, S& s, int32_t n_block) {
    const bool masked = !tile_pair_fully_visible<kBlockM, kBlockN>(mask, tile.m_block, n_block);
    const int64_t key0 = int64_t(n_block) * kBlockN;
    return form == ScoreForm::raw_max
               ? softmax_tile<ScoreForm::raw_max, kBlockN, Config::kLean>(p, mask, s, rows, row, key0, col_base, masked)
               : softmax_tile<ScoreForm::transformed, kBlockN, Config::kLean>(p, mask, s, rows, row, key0, col_base,
                                                                             masked);
  };
  auto softmax = [&](S& s, int32_t n_block) {
    if constexpr (Varlen)
      return softmax_with(geo.mask, s, n_block);
    else
      return softmax_with(p.mask, s, n_block);
  };
  const Ring k_ring(smem.k_ring), v_ring(smem.v_ring);
  const FwdRing<Row, 1> q_ring(smem.q_ring);
  const TensorCoreTurn<Config::kTensorCoreTurns ? Config::kConsumerWarpgroups : 1> turn(consumer);
  turn.start();
  FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::q);
  q_ring.consumer_wait(st.q);
  FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::q);
  auto s_done = [&](int32_t n_block) {  // the S of n_block has landed: its K (and after the last, Q) is free
    release_per_warp(k_ring, st.k);
    ++st.k;
    // (Config::kQReleaseBeforeTail: Q goes back before the tail instead, and the loop carries no test.)
    if (!Config::kQReleaseBeforeTail && n_block == own_end - 1 && release_q) release_per_warp(q_ring, st.q);
  };
  // F49: a warpgroup whose rows see none of the range's keys (rows past seqlen_q, or a later split's keys) gives
  // Q back and takes its prologue turn, then only sits out the tiles below.
  if (Config::kConsumerRanges && own_end == range.begin) {
    if (release_q) release_per_warp(q_ring, st.q);
    if (p.prologue_turn) {
      turn.wait();
      turn.hand_over(false);
    }
  } else {
    // Prologue: S of the first tile, its softmax; nothing to overlap with yet.
    ptx::WgmmaFragmentA p_frag[kKSteps];
    {
      S s;
      FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::k);
      k_ring.consumer_wait(st.k);
      // FA4_FWD_PROLOGUE_TURN=0: outside the turns (every consumer then takes one turn per K/V tile, from the first
      // steady step or the tail, so each barrier stays balanced).
      if (p.prologue_turn) turn.wait();
      FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::k);
      issue_qk<In, HeadDim, kBlockN>(s, q_rows, kQChunkBytes, k_addr(st.k.index));
      FA4_TRACE_RECORD(rec, trace::Kind::s_issue, range.begin);
      if (p.prologue_turn) turn.hand_over(false);
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operand(s);
      FA4_TRACE_RECORD(rec, trace::Kind::s_done, range.begin);
      s_done(range.begin);
      FA4_TRACE_RECORD(rec, trace::Kind::softmax_begin, range.begin);
      softmax(s, range.begin);
      FA4_TRACE_RECORD(rec, trace::Kind::softmax_end, range.begin);
#pragma unroll
      for (int kb = 0; kb < kKSteps; ++kb) p_frag[kb] = ptx::fragment_a_from_accumulator<In>(s, kb);
    }

    // Steady state: S of tile n and P·V of tile n - 1 in flight together; the softmax of n under the P·V.
    // One step as a lambda, compiled twice: interior (std::true_type) for a fully visible tile of a raw_max call
    // without exp2 emulation, whose softmax has no mask, score-form or emulation code at all (FA3 and FA4 peel
    // their masked tiles likewise); the general body for every other tile. 7-15% faster at every head dim than
    // one body with run-time choices (perf-log F6).
    auto steady_step = [&](int32_t n_block, auto interior) {
      S s;
      FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::k);
      k_ring.consumer_wait(st.k);
      turn.wait();
      FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::k);
      issue_qk<In, HeadDim, kBlockN>(s, q_rows, kQChunkBytes, k_addr(st.k.index));
      FA4_TRACE_RECORD(rec, trace::Kind::s_issue, n_block);
      FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::v);
      v_ring.consumer_wait(st.v);
      FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::v);
      issue_pv<In, HeadDim, kBlockN>(o, p_frag, v_addr(st.v.index));
      FA4_TRACE_RECORD(rec, trace::Kind::pv_issue, n_block - 1);
      turn.hand_over(false);

      ptx::wgmma_wait_group<1>();  // S landed; P·V may still run
      ptx::wgmma_fence_operand(s);
      FA4_TRACE_RECORD(rec, trace::Kind::s_done, n_block);
      s_done(n_block);
      FA4_TRACE_RECORD(rec, trace::Kind::softmax_begin, n_block);
      const Rescale rescale = [&] {
        if constexpr (decltype(interior)::value)
          return softmax_tile<ScoreForm::raw_max, kBlockN, Config::kLean, /*Interior=*/true>(
              p, p.mask, s, rows, row, int64_t(n_block) * kBlockN, col_base, /*masked=*/false);
        else
          return softmax(s, n_block);
      }();
      FA4_TRACE_RECORD(rec, trace::Kind::softmax_end, n_block);
      FA4_TRACE_RECORD(rec, rescale.any ? trace::Kind::rescale_taken : trace::Kind::rescale_skipped, n_block);
#if FA4_TRACE
      if (rescale.any) FA4_TRACE_RECORD(rec, trace::Kind::rescale_rows, rescale.rows_moved);
#endif

      auto pv_landed = [&] {
        ptx::wgmma_wait_group<0>();  // P·V landed: O and the P registers are free again
        ptx::wgmma_fence_operand(o);
        FA4_TRACE_RECORD(rec, trace::Kind::pv_done, n_block - 1);
#pragma unroll
        for (int kb = 0; kb < kKSteps; ++kb) ptx::wgmma_fence_operand(p_frag[kb]);
        release_per_warp(v_ring, st.v);
      };
      if constexpr (Config::kPvWaitAfterSoftmax) {
        // F51: the wait in both arms of a branch, which ptxas does not hoist it above, so it stays below the
        // exp2s (in one basic block it was scheduled right after the row max). The condition must be the whole
        // warpgroup's (wgmma.wait_group is .aligned over the warpgroup): the V stage index is, rescale.any is
        // only the warp's. The marker keeps the two arms from being merged back into one.
        if (st.v.index == 0) {
          asm volatile("// F51: P.V wait, stage 0");
          pv_landed();
        } else {
          pv_landed();
        }
        apply_rescale<HeadDim>(o, rescale);
        ++st.v;
      } else {
        // This order (the stage advanced before the rescale) is the measured default's: with the other, ptxas
        // scheduled every forward row differently (perf-log, twenty-sixth session).
        pv_landed();
        ++st.v;
        apply_rescale<HeadDim>(o, rescale);
      }
#pragma unroll
      for (int kb = 0; kb < kKSteps; ++kb) p_frag[kb] = ptx::fragment_a_from_accumulator<In>(s, kb);
    };
    // The fully visible tiles [fast_begin, fast_end) of [range.begin + 1, own_end) (visibility.hpp: one run);
    // the others run the general body. Empty unless the call is in the interior body's case.
    int32_t fast_begin = own_end, fast_end = own_end;
    if (form == ScoreForm::raw_max && p.exp2_emulated_per16 == 0) {
      const TileRun run =
          fully_visible_run<kBlockM, kBlockN>(call_mask, tile.m_block, range.begin + 1, own_end);
      fast_begin = run.begin, fast_end = run.end;
    }
    // General tiles up to the run, the run, then general tiles to the end (two copies of the body, not three).
    int32_t n_block = range.begin + 1;
    while (n_block < own_end) {
      const int32_t general_end = n_block < fast_end ? fast_begin : own_end;
      for (; n_block < general_end; ++n_block) steady_step(n_block, std::false_type{});
      for (; n_block < fast_end; ++n_block) steady_step(n_block, std::true_type{});
    }

    if (Config::kQReleaseBeforeTail && release_q) release_per_warp(q_ring, st.q);  // the last S has landed
    // Tail: the last tile's P·V.
    FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::v);
    v_ring.consumer_wait(st.v);
    turn.wait();
    FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::v);
    issue_pv<In, HeadDim, kBlockN>(o, p_frag, v_addr(st.v.index));
    FA4_TRACE_RECORD(rec, trace::Kind::pv_issue, own_end - 1);
    turn.hand_over(/*last_turn=*/own_end == range.end);
    ptx::wgmma_wait_group<0>();
    ptx::wgmma_fence_operand(o);
    FA4_TRACE_RECORD(rec, trace::Kind::pv_done, own_end - 1);
    release_per_warp(v_ring, st.v);
    ++st.v;
  }

  if constexpr (Config::kConsumerRanges) {
    if (own_end < range.end) {
      const RingStates<Config::kStages> after = sit_out(k_ring, v_ring, turn, st.k, st.v, own_end, range.end);
      st.k = after.k;
      st.v = after.v;
    }
  }
}

}  // namespace fa4::sm90
