// The sm_90a forward tile table, read by the kernel (shared-memory layout, loop trip counts, wgmma shapes) and by
// the host launcher (row choice, grid, dynamic shared memory), so no size is written twice. A kernel is
// instantiated per (dtype, row); a head dim has one row, or several told apart by the query length they serve.

//
// block_m / 64 consumer warpgroups per CTA (64 query rows each = the wgmma M) share every K/V tile, which a
// producer warp loads by TMA into rings of `stages` tiles; the warpgroups take turns on the tensor core
// (round-robin ping-pong, named barriers below) and each overlaps its softmax with its own P·V
// (mma_softmax.cuh). d = 64 has three: its softmax costs twice as much per FLOP, and with two the tensor
// core idled while both were in softmax (0.7–0.8× cuDNN, perf-log G6); three have 160 registers each, with which
// 128-key tiles spill two words per step and still beat 112-key tiles (no spill) by 2-6% (perf-log F18). Up to 1024 queries d = 64 keeps two (block_m 128): a 192-row tile pads
// 12.5% of the rows at s = 512 and 1k and lost 5–16% there (perf-log G9). Up to 64 queries (decode: a GQA
// group's query heads packed as rows) d = 128 has one consumer warpgroup, no turns and no setmaxnreg: the second
// warpgroup of a 128-row tile had no real row, and still cost its GEMMs and softmax on every K/V tile, which
// made a decode step compute-bound (3.3 us per 64 KiB K/V tile, perf-log F4). block_n (keys per K/V tile) is the
// N of S = Q·Kᵀ; the head dim is the N of O += P·V.
// A consumer thread holds S (block_n/2 fp32), P (block_n/4 b32: 4 per k-step of 16) and O (head_dim/2 fp32)
// at once.
//
// | head_dim | seqlen_q | block_m | block_n | stages | smem (Q + 2·stages K/V tiles) | accumulator regs / thread |
// |    64    |  ≤ 1024  |   128   |   128   |   3    | 16 + 6·16 = 112 KiB           | 64 + 32 + 32 = 128        |
// |    64    |  > 1024  |   192   |   128   |   3    | 24 + 6·16 = 120 KiB           | 64 + 32 + 32 = 128        |
// |   128    |   ≤ 64   |    64   |   128   |   3    | 16 + 6·32 = 208 KiB           | 64 + 32 + 64 = 160        |
// |   128    |   > 64   |   128   |   128   |   2    | 32 + 4·32 = 160 KiB           | 64 + 32 + 64 = 160        |
// |   192    |   any    |   128   |    96   |   2    | 48 + 4·36 = 192 KiB           | 48 + 24 + 96 = 168        |
// |   256    |   any    |   128   |    64   |   2    | 64 + 4·32 = 192 KiB           | 32 + 16 + 128 = 176       |
//
// The epilogue stages O in a tile of its own where it fits (d = 64, 128: +16 / +32 KiB), else (d = 192, 256)
// in the warpgroup's own rows of the Q tile. Head dims must be whole 64-element (128-byte) swizzle rows, so 96
// would need a second swizzle mode: not a row of this table.
#pragma once

#include <cstdint>

// A/B candidate (off by default): 24 producer / 240 consumer registers for the two-consumer d = 128 and 192 rows.
#ifndef FA4_AB_REGS
#define FA4_AB_REGS 0
#endif
// A/B candidate (0 = off, the default): the rows of head dim >= FA4_AB_NO_TURNS without tensor-core turns (their
// consumers issue GEMMs freely; issue 11's ablation of ping-pong: 256 is FA3's and FA4's choice, 128 measures it at
// d = 128 too). (The d = 128 row's K/V ring at 3 stages, O staged in Q's rows, measured level with 2: perf-log
// F10-F14 outcome.)
#ifdef FA4_AB_D256_NO_TURNS
#error "FA4_AB_D256_NO_TURNS is FA4_AB_NO_TURNS=256 now (perf-log F43)"
#endif
#ifndef FA4_AB_NO_TURNS
#define FA4_AB_NO_TURNS 0
#endif
// A/B candidate (off by default): the d = 256 row with 80-key tiles (FlashAttention-4's Hopper plan: 128×80, two
// stages, 224 KiB), where 64-key tiles pay a step's fixed costs (waits, turns, the row max's shuffles, the
// correction vote) over 20% fewer keys (perf-log F44).
#ifndef FA4_AB_D256_N80
#define FA4_AB_D256_N80 0
#endif
// The rows of head dim <= FA4_FWD_LEAN_HEAD_DIM (the default, 128, from perf-log F45/F46's A/B on the H100: d = 64
// +3.5-5%, d = 128 +0-2%, d = 256 -1 to -5%) wait with a suspend-time hint (FwdConfig::kWaitSuspendHintNs) and take
// the lean softmax path (FwdConfig::kLean, mma_softmax.cuh). 0 turns both off everywhere, 256 on everywhere.
#ifdef FA4_AB_LEAN_MAX
#error "FA4_AB_LEAN_MAX is FA4_FWD_LEAN_HEAD_DIM now (perf-log F46): the lean path is the default up to d = 128"
#endif
#ifndef FA4_FWD_LEAN_HEAD_DIM
#define FA4_FWD_LEAN_HEAD_DIM 128
#endif
// A/B candidate (off by default; perf-log F49): each consumer warpgroup walks the K/V tiles its own 64 rows see and
// sits out the rest of the tile's range (their waits and turns only): a causal tile's last K/V tiles are fully
// masked for its first rows, and a tile's rows past seqlen_q see nothing at all.
#ifndef FA4_AB_CONSUMER_RANGES
#define FA4_AB_CONSUMER_RANGES 0
#endif
// F50 (perf-log; the default on the d = 64 192-row, FwdConfig::kQReleaseBeforeTail): a consumer gives Q back before
// its tail's P·V instead of from the steady loop's last step (the loop then carries no Q test). 1 = every row.
// A/B candidate (off by default; perf-log F53): a dense call whose keys end with the row (causal, a right window)
// pads its first query tile at the top instead of its last at the bottom, so the padding rows ride along with the
// tile that sees the fewest keys, not the most: the d = 64 192-row at 4k causal walks 5.5% fewer consumer steps
// (384 → 363 per head), 2k 5%, 8k-16k 1.5%. The kernel numbers rows from shift = FwdParams::m_shift rows above
// row 0 (the host's seqlen_q and mask are those of the renumbered rows, so tiles, ranges and masks are computed
// as always); only Q's load and the stores of O and LSE translate back.
#ifndef FA4_AB_TOP_PAD
#define FA4_AB_TOP_PAD 0
#endif
#ifndef FA4_AB_Q_BEFORE_TAIL
#define FA4_AB_Q_BEFORE_TAIL 0
#endif
// F51 (perf-log; the default at d = 256, FwdConfig::kPvWaitAfterSoftmax): the steady step's P·V wait placed after
// the softmax's exp2s. 1 = every row.
#ifndef FA4_AB_PV_WAIT_LATE
#define FA4_AB_PV_WAIT_LATE 0
#endif
static_assert(FA4_AB_NO_TURNS == 0 || FA4_AB_NO_TURNS >= 64,
              "FA4_AB_NO_TURNS: 0 (off) or the first head dim without turns");

// F32 (the default since the thirteenth session; 0 in a build's CUDA flags turns it off): a paged call's V tiles
// issued by a second warp of the producer warpgroup (v_load_role in load.cuh), which follows the published tile
// slots, so one thread no longer issues every K and V box of a step in series (perf-log F32: 64-row pages 0.80-0.86
// → 0.86-0.90 of the contiguous cache).
#ifndef FA4_AB_PAGED_V_WARP
#define FA4_AB_PAGED_V_WARP 1
#endif

namespace fa4::sm90 {

struct FwdTile {
  int head_dim;
  int block_m;  // query rows per CTA = 64 · consumer warpgroups
  int block_n;  // keys per K/V tile
  int stages;   // depth of the K ring and of the V ring
  int max_seqlen_q;  // the longest query sequence this row serves; 0 = any (the head dim's last row)
};

inline constexpr FwdTile kFwdTiles[] = {
    // 64-key tiles here and on the d = 128 row lost 9-18% at 512-2k (perf-log F52, removed).
    {64, 128, 128, 3, 1024},
    // 128-key tiles (FlashAttention-4's Hopper plan), not 112: +2-6% at 2k-8k on the H100 though its steady step
    // reloads two spilled words (perf-log F18).
    {64, 192, 128, 3, 0},
    {128, 64, 128, 3, 64},
    {128, 128, 128, 2, 0},
    {192, 128, 96, 2, 0},
    {256, 128, FA4_AB_D256_N80 ? 80 : 64, 2, 0},
};
inline constexpr int kFwdRows = int(sizeof(kFwdTiles) / sizeof(kFwdTiles[0]));

// The row that runs (head_dim, seqlen_q): the head dim's first row whose max_seqlen_q admits it; -1 if none.
constexpr int fwd_row(int head_dim, int64_t seqlen_q) {
  for (int r = 0; r < kFwdRows; ++r)
    if (kFwdTiles[r].head_dim == head_dim && (kFwdTiles[r].max_seqlen_q == 0 || seqlen_q <= kFwdTiles[r].max_seqlen_q))
      return r;
  return -1;
}

// The row a variable-length batch runs: the head dim's last (any length), whatever its sequences' lengths (one
// varlen kernel per head dim and dtype); -1 if the head dim has no row.
constexpr int fwd_varlen_row(int head_dim) {
  int last = -1;
  for (int r = 0; r < kFwdRows; ++r)
    if (kFwdTiles[r].head_dim == head_dim) last = r;
  return last;
}

// Every head dim's rows are adjacent, ordered by max_seqlen_q (never negative), and end with one that takes
// any length.
constexpr bool fwd_rows_are_well_formed() {
  for (int r = 0; r < kFwdRows; ++r) {
    if (kFwdTiles[r].max_seqlen_q < 0) return false;
    const bool last_of_head_dim = r + 1 == kFwdRows || kFwdTiles[r + 1].head_dim != kFwdTiles[r].head_dim;
    if (last_of_head_dim != (kFwdTiles[r].max_seqlen_q == 0)) return false;
    if (!last_of_head_dim && kFwdTiles[r + 1].max_seqlen_q != 0 && kFwdTiles[r + 1].max_seqlen_q <= kFwdTiles[r].max_seqlen_q)
      return false;
    for (int later = r + 2; later < kFwdRows; ++later)
      if (kFwdTiles[later].head_dim == kFwdTiles[r].head_dim && kFwdTiles[later - 1].head_dim != kFwdTiles[r].head_dim)
        return false;
  }
  return true;
}
static_assert(fwd_rows_are_well_formed(), "kFwdTiles: a head dim's rows are adjacent, by length, last = any length");

inline constexpr int kWarpgroupThreads = 128;
inline constexpr bool kTopPad = FA4_AB_TOP_PAD != 0;  // FwdParams::m_shift may be nonzero (perf-log F53)
inline constexpr int kWgmmaM = 64;              // rows of one warpgroup's wgmma
inline constexpr int kSw128Columns = 64;        // 16-bit elements per 128-byte swizzled row (one TMA box width)
inline constexpr int kElementBytes = 2;         // bf16 / fp16
inline constexpr uint32_t kSmemPerBlockMax = 227 * 1024;  // sm_90 opt-in limit per CTA
inline constexpr uint32_t kSmemAlignSlack = 1024;         // dynamic smem is rounded up to the swizzle repeat

// Named barriers (ids 1..; 0 is __syncthreads). Ping-pong: consumer warpgroup w waits on its turn barrier before
// issuing its GEMMs and arrives on the next consumer's after, so the warpgroups' GEMMs take turns on the tensor
// core (round robin) and each one's softmax runs under the others' GEMMs. epilogue(w): the 128 threads of
// warpgroup w, before its TMA store of O.
inline constexpr int kMaxConsumerWarpgroups = 3;
enum class NamedBarrier : uint32_t {
  first_turn = 1,                                   // consumer c's turn: first_turn + c
  first_epilogue = first_turn + kMaxConsumerWarpgroups,  // consumer c's epilogue: first_epilogue + c
  end = first_epilogue + kMaxConsumerWarpgroups,
};
static_assert(static_cast<uint32_t>(NamedBarrier::end) <= 16, "a CTA has 16 named barriers");

// The compile-time view of kFwdTiles[Row].
template <int Row>
struct FwdConfig {
  static_assert(Row >= 0 && Row < kFwdRows, "no such row in kFwdTiles");
  static constexpr FwdTile kTile = kFwdTiles[Row];
  static constexpr int kHeadDim = kTile.head_dim;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr int kConsumerWarpgroups = kBlockM / kWgmmaM;
  static constexpr int kProducerWarpgroups = 1;  // warp 0 works (F32's define: warp 1 too); the rest exit
  // setmaxnreg budgets: the producer gives registers back, the consumers take them. 40 / 232 (CUTLASS's split):
  // with 24 the producer's tile loop spills 16 B; the consumers need ~228 at d = 128. d = 256 holds a 128-float O
  // per thread and spilled 112 B under 232; with 24 / 240 the kernel spills 52 B (producer and consumer).
  // Three consumer warpgroups (512 threads) share the file as 32 / 160.
  // One consumer warpgroup (256 threads) has up to 255 registers per thread at launch: no setmaxnreg.
  static constexpr bool kSetMaxNReg = kConsumerWarpgroups > 1;
  // Whether the consumer warpgroups take turns at the tensor core (TensorCoreTurn): always with two or three, but
  // for the rows of head dim >= FA4_AB_NO_TURNS under that A/B candidate (FA3 and FA4 drop their scheduler barrier
  // above head dim 128).
  static constexpr bool kTensorCoreTurns =
      kConsumerWarpgroups > 1 && !(FA4_AB_NO_TURNS > 0 && kHeadDim >= FA4_AB_NO_TURNS);
  // A/B candidate FA4_AB_REGS (off by default): 24 / 240 (FA3's and FA4's split) for the two-consumer d = 128 and
  // d = 192 rows too.
  static constexpr bool kRegs24x240 = kHeadDim >= 256 || (FA4_AB_REGS && kHeadDim >= 128);
  static constexpr int kProducerRegisters = kConsumerWarpgroups == 3 ? 32 : (kRegs24x240 ? 24 : 40);
  static constexpr int kConsumerRegisters =
      kConsumerWarpgroups == 1 ? 248 : kConsumerWarpgroups == 3 ? 160 : (kRegs24x240 ? 240 : 232);
  static constexpr int kThreads = kWarpgroupThreads * (kProducerWarpgroups + kConsumerWarpgroups);
  // F45 and F46 (perf-log), measured together: where they win, every wait of the kernel's rings sleeps in
  // try_wait (a 10 ms hint, CUTLASS's) instead of polling, and the softmax's chains from S to the first exp2 are
  // shorter. At d = 256 each alone lost 2-5% at 16k, so the larger rows keep the plain forms.
  static constexpr bool kLean = kHeadDim <= FA4_FWD_LEAN_HEAD_DIM;
  static constexpr uint32_t kWaitSuspendHintNs = kLean ? 10'000'000u : 0u;
  // FA4_AB_CONSUMER_RANGES: consumers with ranges of their own (mma_softmax.cuh), on the rows whose tiles are not
  // square (d = 64 192×128, d = 192, d = 256), where a causal tile's first consumer has keys to skip whenever
  // seqlen_q = seqlen_k. A lone consumer's rows are the tile's. The square rows are left out on purpose: with
  // seqlen_q = seqlen_k every consumer's causal rows reach the tile's last K/V tile, and what they could skip
  // otherwise (an offset that is not a multiple of 128, a last tile's padded rows) is rare or small.
  static constexpr bool kConsumerRanges = FA4_AB_CONSUMER_RANGES && kConsumerWarpgroups > 1 && kBlockM != kBlockN;
  // F50: the Q release test out of the steady loop (Q given back before the tail). The default on the d = 64
  // 192-row (three consumers; H100, perf-log F50's outcome: +1-2% at 2k-16k); it lost 3-5% at d = 128 and 1-2% on
  // the d = 64 128-row (≤ 1k), which keep the test. Always with kConsumerRanges: under F49 own_end is not provably
  // warp-uniform, so the test in the loop cost a divergence check and a reconvergence region as well.
  // FA4_AB_Q_BEFORE_TAIL=1 turns it on for every row.
  static constexpr bool kQReleaseBeforeTail = FA4_AB_Q_BEFORE_TAIL || kConsumerRanges || kConsumerWarpgroups == 3;
  // F51 (see mma_softmax.cuh's steady step): the default at d = 256 (H100, perf-log F51's outcome: non-causal +1-3%
  // at 2k-16k, causal level); level at d = 128, and the d = 64 192-row spills with it. FA4_AB_PV_WAIT_LATE=1 turns
  // it on for every row.
  static constexpr bool kPvWaitAfterSoftmax = FA4_AB_PV_WAIT_LATE || kHeadDim >= 256;
  static constexpr int kHeadDimChunks = kHeadDim / kSw128Columns;  // TMA boxes per tile, smem chunks per row

  static constexpr uint32_t kQTileBytes = uint32_t(kBlockM) * kHeadDim * kElementBytes;
  static constexpr uint32_t kKvTileBytes = uint32_t(kBlockN) * kHeadDim * kElementBytes;
  // One Q tile in flight: a second where it fits (the next work tile's Q loading while this one runs) measured
  // level at 2k-8k and 1-4% slower at 512-1k (perf-log F19).
  static constexpr uint32_t kTileBytes = kQTileBytes + 2u * kStages * kKvTileBytes;
  // O is staged for its TMA store in a buffer of its own when one fits (then Q is free, and the next tile's Q
  // can load, as soon as the last S is computed), else in the warpgroup's rows of the Q tile.
  static constexpr uint32_t kOTileBytes = kQTileBytes;
  static constexpr bool kSeparateOStaging = kTileBytes + kOTileBytes + 2048 + kSmemAlignSlack <= kSmemPerBlockMax;

  static_assert(kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= kMaxConsumerWarpgroups,
                "one consumer warpgroup, or two or three taking round-robin turns (NamedBarrier ids)");
  static_assert(kWarpgroupThreads * (kProducerWarpgroups * kProducerRegisters +
                                     kConsumerWarpgroups * kConsumerRegisters) <= 65536,
                "setmaxnreg budgets exceed the register file: an increase would wait forever");
  static_assert(kBlockM % kWgmmaM == 0, "block_m is whole warpgroups of 64 rows");
  static_assert(kHeadDim % kSw128Columns == 0, "the head dim is whole 128-byte swizzle rows (64 elements)");
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "whole wgmma k-steps of 16 for both GEMMs");
  static_assert(kBlockN % 8 == 0 && kBlockN <= 256 && kHeadDim <= 256, "wgmma N is a multiple of 8 in [8, 256]");
  static_assert(kBlockM <= 256 && kBlockN <= 256, "TMA boxes have at most 256 rows");
  static_assert(kQTileBytes % 1024 == 0 && kKvTileBytes % 1024 == 0,
                "every tile starts on the 1024-byte swizzle repeat (descriptor base offset 0)");
  static_assert(kTileBytes + 1024 + kSmemAlignSlack <= kSmemPerBlockMax,
                "tiles + barriers + alignment slack exceed the 227 KiB of shared memory per CTA");
  static_assert(kStages >= 2, "the ring needs two stages so loads overlap compute");
  // One consumer thread's live accumulators: S (block_n/2), P fragments (block_n/4), O (head_dim/2); leave
  // room for addresses and softmax state under the consumer budget (ptxas -v is the real check: no spills).
  static constexpr int kAccumulatorRegisters = kBlockN / 2 + kBlockN / 4 + kHeadDim / 2;
  static_assert(kAccumulatorRegisters <= kConsumerRegisters - 32, "accumulators would leave too few registers");
  static_assert(65536 / kThreads >= kProducerRegisters, "launch budget below the producer's");
  // setmaxnreg.inc takes only what the CTA's setmaxnreg.dec freed from the launch allocation (65536 / threads,
  // rounded down to 8): the producers must free at least what the consumers add.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(kProducerWarpgroups * (kLaunchRegisters - kProducerRegisters) >=
                    kConsumerWarpgroups * (kConsumerRegisters - kLaunchRegisters),
                "the producers' setmaxnreg.dec frees fewer registers than the consumers' setmaxnreg.inc takes");
};

}  // namespace fa4::sm90
