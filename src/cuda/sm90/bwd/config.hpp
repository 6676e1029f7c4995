// The sm_90a backward tile table and workspace layout, read by the kernels (shared-memory layout, wgmma shapes,
// trip counts) and by the host (grid, dynamic shared memory, workspace size), so no size is written twice.
//
// The main kernel is K/V-stationary: a CTA owns block_n keys of one (batch, kv head) and walks the query tiles
// of block_m rows that see them, for every query head of the group. Each consumer warpgroup owns 64 of the
// keys (the wgmma M) and keeps dK and dV of its keys in registers; per query tile it computes
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (SS wgmma, 64 keys × block_m queries), Pᵀ = exp2(Sᵀ·scale·log2e − LSE₂),
//   dSᵀ = Pᵀ ∘ (dPᵀ − D), dV += Pᵀ·dO and dK += dSᵀ·Q (RS wgmma: P and dS straight from the registers),
//   and writes dSᵀ to shared memory, from where dQ = dS·K (SS wgmma, A read MN-major) is computed by the
//   warpgroups together, one 64 × 64·k slab each, and added to the fp32 dQ accumulator by TMA bulk reduce-add.
//
// | head_dim | block_m | block_n | stages | smem: K + V + stages·(Q + dO) + 2 dSᵀ + dQ staging      | regs (dK dV Sᵀ dPᵀ) |
// |    64    |   128   |   128   |   2    | 16 + 16 + 2·(16 + 16) + 2·32 + 2·16 = 192 KiB            | 32 32 64 64          |
// |   128    |    64   |   128   |   2    | 32 + 32 + 2·(16 + 16) + 2·16 + 2·16 = 192 KiB            | 64 64 32 32          |
//
// Head dims 192 and 256 do not fit that plan (dK and dV of 64 keys would take d registers per thread), so their
// rows split the head dim instead (column_split, mma_wide.cuh): both warpgroups share the CTA's 64 keys; each
// computes Sᵀ and dPᵀ for half of the tile's 64 queries (N = 32) and writes Pᵀ and dSᵀ to shared memory, then
// computes dV, dK and dQ for its head-dim chunks (d = 256: two each; d = 192: two and one) with both operands
// in shared memory, and adds its dQ straight from registers (red.global.add.v4.f32: no staging buffer, so two
// stages of Q and dO fit).
// | head_dim | block_m | block_n | stages | smem: K + V + stages·(Q + dO) + 2 (Pᵀ + dSᵀ)            | regs (dK dV dQ Sᵀ dPᵀ) |
// |   192    |    64   |    64   |   2    | 24 + 24 + 2·(24 + 24) + 2·(8 + 8) = 176 KiB              | 64 64 64 16 16 (max) |
// |   256    |    64   |    64   |   2    | 32 + 32 + 2·(32 + 32) + 2·(8 + 8) = 224 KiB              | 64 64 64 16 16       |
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/config.hpp"

// A/B candidate (0 = off, the default): the backward's ring waits and dQ staging waits with this suspend-time
// hint (ns), as the forward's rows up to d = 128 wait since F45 (perf-log B33; measured for the forward only).
#ifndef FA4_AB_BWD_WAIT_HINT_NS
#define FA4_AB_BWD_WAIT_HINT_NS 0
#endif

// B27 (the default since the thirteenth session; 0 in a build's CUDA flags restores one buffer): the d = 64 row
// with two deterministic staging buffers (B23's), which fit only without the launch's 1024-byte alignment slack:
// that row then takes the dynamic shared memory base as it is and traps if it is not 1024-byte aligned
// (BwdConfig::kAlignedSmemBase; perf-log B27: deterministic d = 64 non-causal 1k 0.83 → 0.87 of the default).
#ifndef FA4_AB_BWD_D64_TWO_BUFFERS
#define FA4_AB_BWD_D64_TWO_BUFFERS 1
#endif

namespace fa4::sm90 {

struct BwdTile {
  int head_dim;
  int block_m;  // query rows per step of the walk
  int block_n;  // keys per CTA = 64 · consumer warpgroups
  int stages;   // depth of the Q/dO/LSE/D ring
  bool column_split = false;  // the warpgroups share the keys and split the head dim (mma_wide.cuh)
  // Deterministic mode's turn chains (dq_turn_of; FA4_BWD_DET_CHAINS overrides), without a mask and with one
  // (causal or a window). perf-log B17 (H100, 955f321, store-first on, det / default at 2k / 8k): unmasked, four
  // chains give d = 64 0.91 / 0.95 (two: 0.86 / 0.95), d = 256 0.79 / 0.80 (two: 0.74 / 0.80), and d = 128 is
  // best with one (0.87 / 0.91); masked, one chain wins at every head dim (d = 64 1.00 / 1.00, d = 128 1.02 / 0.96,
  // d = 256 0.82 / 0.77; four: 0.90, 0.72, 0.57 at 2k): a causal block's turns are already staggered by the
  // diagonal, and each copy more is one more to sum. d = 192 follows d = 256 (unmeasured).
  // Up to kShortKeysMax keys (a varlen call's max_seqlen_k) at most kShortKeysDetChains, whatever the row says:
  // perf-log B26 (H100, cae5d2f, two reps, det / default without a mask): four chains → two at 512 keys d = 64
  // 0.80 → 0.89, d = 256 0.80 → 0.88; at 1k 0.83 → 0.84 and 0.83 → 0.85; at 2k four stay best at d = 64 (0.88
  // against 0.84) and level at d = 256. Each chain is one more fp32 dQ copy written and summed, a fixed cost per
  // query row, while the work per row grows with the keys.
  int det_chains = 1;
  int det_chains_masked = 1;
  // Default mode, key-split rows without the CTA pair: each warpgroup adds its dQ slab from its registers
  // (red.global.add.v4.f32) instead of staging it for the writer's bulk reduce-add (FA4_BWD_DQ_REGISTER_ADDS
  // overrides). perf-log B20 (H100, 5bff966, 3 reps over two calls): d = 128 +3-4% at 2k and 8k, both masks (no
  // staging writes: its row is bound by shared memory, docs/model.md); d = 64 level to -1.5%.
  bool dq_register_adds = false;
  // Deterministic mode without the CTA pair: each warpgroup stages its dQ slabs in two buffers, one per dQ writer
  // (the tiles go to the writers in turn), so a writer waiting for a slab's turn holds only its own buffer and the
  // warpgroup goes on staging the next tile's slab for the other writer (perf-log B23). The second buffers share
  // their memory with the pair's dq_incoming; at d = 64 they fit only without the alignment slack (B27's define).
  int det_staging_buffers = 1;
  // Deterministic mode, key-split rows without the CTA pair and without a mask: each warpgroup adds its dQ slab
  // from its registers in its turn (a helper warp per warpgroup waits for the turn), with no writer and no
  // staging (FA4_BWD_DET_REGISTER_ADDS overrides). perf-log B24 (H100, d11666f, two reps): d = 128 unmasked
  // +3% at 2k (det / default 0.84-0.85 -> 0.87-0.88), +2% at 8k; masked it loses 2-3% (the diagonal already
  // staggers the turns, and the writers' staging overlaps better), and at d = 64 it loses 1-5%.
  bool det_register_adds_unmasked = false;
};

inline constexpr BwdTile kBwdTiles[] = {
    {64, 128, 128, 2, false, 4, 1, false, FA4_AB_BWD_D64_TWO_BUFFERS ? 2 : 1},
    {128, 64, 128, 2, false, 1, 1, true, 2, true},
    {192, 64, 64, 2, true, 4, 1, false},  // column-split rows add from registers in every mode
    {256, 64, 64, 2, true, 4, 1, false},
};
inline constexpr int kBwdRows = int(sizeof(kBwdTiles) / sizeof(kBwdTiles[0]));

// Consumer warpgroups of a row: one per 64 keys, or two sharing the keys when the head dim is split.
constexpr int bwd_consumer_warpgroups(const BwdTile& t) { return t.column_split ? 2 : t.block_n / 64; }

// The CTA pair (docs/sm90-backward.md): key-split rows may run as clusters of two CTAs on neighbouring key
// blocks. Each CTA loads half of every Q and dO tile and TMA-multicasts it to both: by head-dim chunk when the
// tile has two or more, else by rows (a box of block_m / 2 rows); the host builds the Q and dO maps with this box.
constexpr bool bwd_pair_capable(const BwdTile& t) { return !t.column_split; }
constexpr int bwd_pair_box_rows(const BwdTile& t) { return t.head_dim / 64 == 1 ? t.block_m / 2 : t.block_m; }

constexpr int bwd_row(int head_dim) {
  for (int r = 0; r < kBwdRows; ++r)
    if (kBwdTiles[r].head_dim == head_dim) return r;
  return -1;
}

// dQ accumulator units: a 64 × 64 fp32 block of dQ stored in the wgmma accumulator order of its warpgroup,
// [8 column groups][128 threads][4 floats], so the staging writes and the bulk reduce-add are contiguous and
// bank-conflict free; the postprocess kernel puts the elements back in place (accumulator_row / _col).
inline constexpr int kDqUnitRows = 64, kDqUnitCols = 64;
inline constexpr int kDqUnitFloats = kDqUnitRows * kDqUnitCols;

// The workspace of one backward call, in bytes from its (256-byte aligned) base. The fp32 rows of a query
// head: a dense batch pads each (batch, head) pair's rows to whole block_m tiles (rows_padded), so region r =
// batch·heads + head holds rows_padded rows; a variable-length batch packs them (FlashAttention-3's layout): one
// region per head of rows_total = round_up(total_q + batch·block_m, block_m) rows, sequence b's from
// base(b) = ⌊(cu_seqlens_q[b] + b·block_m) / block_m⌋·block_m (bwd_ws_row_base; base(b + 1) − base(b) ≥
// round_up(len_b, block_m), so tiles never overlap), so the size follows the tokens, not sequences × longest
// (where that is smaller; else a variable-length batch keeps per-sequence regions of rows_padded rows).
//   dq_accum  fp32 [chains][regions][region rows/64][head_dim/64] units (zeroed by the preprocess kernel, except
//             in deterministic mode, where each chain's first adder stores and the postprocess skips a copy no
//             block of its chain visited; FA4_BWD_DET_STORE_FIRST=0 zeroes them there too)
//   lse_log2  fp32 [regions][region rows]  LSE·log2(e); +inf for padding and fully masked rows (P = 0)
//   dsum      fp32 [regions][region rows]  D = rowsum(dO ∘ O); 0 for padding
//   dq_turn   int32 [chains][regions][region rows/block_m][consumer warpgroups]  deterministic mode: how many
//             key blocks of the chain have added their slab of this query tile so far (zeroed by the preprocess)
// chains: deterministic mode's turn chains (key block n adds into copy n % chains in its own turn order; the
// postprocess sums the copies in a fixed order, see dq_turn_of); 1 outside deterministic mode.
struct BwdWorkspaceLayout {
  int64_t rows_padded = 0;  // a sequence's rows, padded to block_m tiles (the pre/postprocess grids)
  int64_t rows_total = 0;   // variable-length batches: the rows of one head's region (0: dense)
  int chains = 1;
  size_t dq_accum = 0, lse_log2 = 0, dsum = 0, dq_turn = 0, bytes = 0;
  size_t dq_accum_copy_floats = 0, dq_turn_copy_counters = 0;  // one chain's accumulator and counters
};

constexpr size_t align_up_256(size_t x) { return (x + 255) / 256 * 256; }

inline constexpr int kBwdMaxDetChains = 4;
constexpr bool every_det_chains_fit() {
  for (const BwdTile& t : kBwdTiles)
    for (int chains : {t.det_chains, t.det_chains_masked})
      if (chains < 1 || chains > kBwdMaxDetChains) return false;
  return true;
}
static_assert(every_det_chains_fit(), "a row's deterministic chain count the workspace layout holds");
// The cap on chains up to kShortKeysMax keys (BwdTile::det_chains; perf-log B26).
inline constexpr int64_t kShortKeysMax = 1024;
inline constexpr int kShortKeysDetChains = 2;
static_assert(kShortKeysDetChains >= 1 && kShortKeysDetChains <= kBwdMaxDetChains, "a chain count the layout holds");

// varlen_total_q >= 0: a variable-length batch of `batch` sequences and that many packed query rows (seqlen_q is
// the longest sequence's).
constexpr BwdWorkspaceLayout bwd_workspace_layout(int row, int64_t batch, int64_t heads_q, int64_t seqlen_q,
                                                  int chains = 1, int64_t varlen_total_q = -1) {
  BwdWorkspaceLayout w;
  if (row < 0) return w;
  const BwdTile t = kBwdTiles[row];
  w.rows_padded = (seqlen_q + t.block_m - 1) / t.block_m * t.block_m;
  // The compact layout where it is the smaller (packed rows may include rows of no sequence, and equal lengths
  // of whole tiles need batch·block_m rows more than the per-sequence layout): rows_total 0 keeps the latter.
  if (varlen_total_q >= 0) {
    const int64_t rows_total = (varlen_total_q + batch * t.block_m + t.block_m - 1) / t.block_m * t.block_m;
    if (rows_total < batch * w.rows_padded) w.rows_total = rows_total;
  }
  w.chains = chains;
  const size_t regions = w.rows_total > 0 ? size_t(heads_q) : size_t(batch) * size_t(heads_q);
  const size_t rows = size_t(w.rows_total > 0 ? w.rows_total : w.rows_padded);
  w.dq_accum_copy_floats = regions * rows * size_t(t.head_dim);
  w.dq_turn_copy_counters = regions * (rows / size_t(t.block_m)) * size_t(bwd_consumer_warpgroups(t));
  w.dq_accum = 0;
  w.lse_log2 = align_up_256(size_t(chains) * w.dq_accum_copy_floats * 4);
  w.dsum = align_up_256(w.lse_log2 + regions * rows * 4);
  w.dq_turn = align_up_256(w.dsum + regions * rows * 4);
  w.bytes = align_up_256(w.dq_turn + size_t(chains) * w.dq_turn_copy_counters * 4);
  return w;
}

// Named barriers of the main kernel (0 is __syncthreads).
inline constexpr int kBwdMaxConsumerWarpgroups = 2;
// Deterministic mode's dQ writer warps (key-split rows): writer w takes the query tiles t of the CTA's walk with
// t % 2 == w, so one writer's wait for its adds to be performed (before it passes the turns on) overlaps the
// other's turn wait and adds. The default mode has one writer, which never waits for its adds (perf-log B12).
inline constexpr int kBwdMaxDqWriters = 2;
enum class BwdBarrier : uint32_t {
  ds_ready = 1,         // every consumer warpgroup has written its dSᵀ rows (before dQ = dS·K)
  first_warpgroup = 2,  // consumer c's own 128 threads: first_warpgroup + c
  // consumer c's dQ slab is staged for dQ writer w (+ that writer): first_dq_full + c + kBwdMaxConsumerWarpgroups·w
  // (the hand-back is an mbarrier: DqStaging::dq_empty)
  first_dq_full = first_warpgroup + kBwdMaxConsumerWarpgroups,
  dq_adders = first_dq_full + kBwdMaxDqWriters * kBwdMaxConsumerWarpgroups,  // the CTA pair's three dQ adder warps
  // Deterministic column-split rows with turn helpers (dq_reduce.cuh): consumer c's turn is granted by its
  // helper warp (first_turn_granted + c), and its adds are issued for the helper to publish (first_adds_issued + c).
  first_turn_granted = dq_adders + 1,
  first_adds_issued = first_turn_granted + kBwdMaxConsumerWarpgroups,
  end = first_adds_issued + kBwdMaxConsumerWarpgroups,
};
static_assert(static_cast<uint32_t>(BwdBarrier::end) <= 16, "a CTA has 16 named barriers");

template <int Row>
struct BwdConfig {
  static_assert(Row >= 0 && Row < kBwdRows, "no such row in kBwdTiles");
  static constexpr BwdTile kTile = kBwdTiles[Row];
  static constexpr int kHeadDim = kTile.head_dim;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr bool kColumnSplit = kTile.column_split;
  static constexpr int kConsumerWarpgroups = bwd_consumer_warpgroups(kTile);
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumerWarpgroups);
  static constexpr int kProducerRegisters = 24;  // the load warp and the dQ writer warp
  static constexpr int kConsumerRegisters = 240;
  static constexpr int kHeadDimChunks = kHeadDim / kSw128Columns;
  static constexpr uint32_t kWaitSuspendHintNs = FA4_AB_BWD_WAIT_HINT_NS;  // cuda::Pipeline's (B33, off)

  // dQ = dS·K: (block_m/64)·(head_dim/64) units of 64 × 64, split evenly over the warpgroups, each taking
  // consecutive units of one 64-row chunk (one wgmma of N = 64·units). Column-split rows: a warpgroup's units
  // are its head-dim chunks (the first warpgroup takes the odd one at d = 192).
  static constexpr int kDqUnits = (kBlockM / kDqUnitRows) * (kHeadDim / kDqUnitCols);
  static constexpr int kDqUnitsPerWarpgroup = kColumnSplit ? 1 : kDqUnits / kConsumerWarpgroups;
  static constexpr int kDqN = kDqUnitsPerWarpgroup * kDqUnitCols;
  // Column-split rows: warpgroup c owns head-dim chunks [first, first + count) and queries [32c, 32c + 32) of
  // each tile's Sᵀ, dPᵀ.
  static constexpr int kWideChunks0 = (kHeadDimChunks + 1) / 2;
  static constexpr int kScoreQueries = kColumnSplit ? kBlockM / 2 : kBlockM;

  static constexpr uint32_t kQTileBytes = uint32_t(kBlockM) * kHeadDim * kElementBytes;   // Q or dO
  static constexpr uint32_t kKvTileBytes = uint32_t(kBlockN) * kHeadDim * kElementBytes;  // K or V
  static constexpr uint32_t kDsTileBytes = uint32_t(kBlockN) * kBlockM * kElementBytes;
  static constexpr uint32_t kRowVectorBytes = uint32_t(kBlockM) * 4;                       // LSE₂ or D
  static constexpr uint32_t kQStageBytes = 2 * kQTileBytes + 2 * kRowVectorBytes;         // what one stage receives
  static constexpr uint32_t kDqStagingBytes = kColumnSplit ? 0u : uint32_t(kDqUnitsPerWarpgroup) * kDqUnitFloats * 4;
  // The pair: Q/dO halves (rows or head-dim chunks), and dQ slabs summed half by half (each CTA adds the peer's
  // half into its own staging and reduce-adds that half: one reduce-add per pair and tile reaches L2).
  static constexpr bool kPairCapable = bwd_pair_capable(kTile);
  static constexpr bool kPairSplitsRows = bwd_pair_box_rows(kTile) != kBlockM;
  static constexpr uint32_t kDqHalfBytes = kDqStagingBytes / 2;
  static constexpr int kDetStagingBuffers = kTile.det_staging_buffers;
  // The row runs on the dynamic shared memory base as the launch gives it (no alignment slack; the kernel checks
  // the base): only B27's d = 64 row with two staging buffers, which is ~1 KiB too large for the slack.
  static constexpr bool kAlignedSmemBase = FA4_AB_BWD_D64_TWO_BUFFERS && kHeadDim == 64;

  static_assert(kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= kBwdMaxConsumerWarpgroups,
                "named barrier ids exist for up to two consumer warpgroups");
  static_assert(kColumnSplit ? kBlockN == kWgmmaM : kBlockN % kWgmmaM == 0,
                "every consumer warpgroup owns 64 keys (column-split rows: the same 64)");
  static_assert(!kColumnSplit || (kBlockM == 64 && kScoreQueries % 16 == 0),
                "column-split rows: one 64-query swizzle row of Pᵀ/dSᵀ, halves of whole 16-query k-blocks");
  static_assert(kBlockM % kSw128Columns == 0, "dSᵀ rows are whole 128-byte swizzle rows of 64 queries");
  static_assert(kHeadDim % kSw128Columns == 0, "the head dim is whole 128-byte swizzle rows (64 elements)");
  static_assert(kColumnSplit || kDqUnits % kConsumerWarpgroups == 0, "the dQ units split evenly over the warpgroups");
  static_assert(kColumnSplit || (kHeadDim / kDqUnitCols) % kDqUnitsPerWarpgroup == 0,
                "a warpgroup's dQ units lie in one 64-row chunk (one wgmma)");
  static_assert(!kPairCapable || kPairSplitsRows || kHeadDimChunks % 2 == 0,
                "a pair splits Q/dO tiles into two halves: by rows (one chunk) or by an even number of chunks");
  static_assert(!kPairCapable || (kDqHalfBytes % (32 * 16) == 0 && kDqUnitsPerWarpgroup == 1),
                "a dQ half is whole 16-byte vectors of the writer warp, and half of one unit (contiguous in the workspace)");
  static_assert(kDetStagingBuffers == 1 || (kDetStagingBuffers == kBwdMaxDqWriters && !kColumnSplit),
                "a key-split row stages one buffer, or one per deterministic dQ writer");
  static_assert(kBlockM <= 256 && kBlockN <= 256, "TMA boxes have at most 256 rows; wgmma N at most 256");
  static_assert(kStages >= 2, "the ring needs two stages so loads overlap compute");
  static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters) <= 65536,
                "setmaxnreg budgets exceed the register file");
  // setmaxnreg.inc only takes registers that setmaxnreg.dec gave back inside the CTA: from the launch's per-thread
  // allocation (65536 / threads, rounded down to 8), the producer must free at least what the consumers add, or
  // the last consumer warpgroup waits in setmaxnreg.inc forever (32 producer registers hung every row).
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(kLaunchRegisters - kProducerRegisters >= kConsumerWarpgroups * (kConsumerRegisters - kLaunchRegisters),
                "the producer's setmaxnreg.dec frees fewer registers than the consumers' setmaxnreg.inc takes");
  // Live accumulators of a consumer thread: dK, dV (head_dim/2 each), Sᵀ and dPᵀ (block_m/2 each); column-split
  // rows: dK, dV and dQ (32 per owned chunk each; Sᵀ and dPᵀ, 16 each, are dead once dQ is issued).
  static constexpr int kAccumulatorRegisters = kColumnSplit ? 3 * 32 * kWideChunks0 : kHeadDim + kBlockM;
  static_assert(kAccumulatorRegisters <= kConsumerRegisters - 40, "accumulators would leave too few registers");
};

}  // namespace fa4::sm90
