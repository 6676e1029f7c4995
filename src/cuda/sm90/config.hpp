// The sm_90a forward tile table: one row per head dim, read by the kernel (shared-memory layout, loop trip
// counts, wgmma shapes) and by the host launcher (grid, dynamic shared memory), so no size is written twice.
//
// First kernel (DESIGN.md §6 step 4, correctness first): ONE consumer warpgroup per CTA (block_m = 64 query
// rows, the wgmma M), a producer warpgroup of which one warp issues TMA, K and V in rings of `stages` tiles,
// no ping-pong and no intra-warpgroup overlap yet. block_n (keys per K/V tile) is the N of S = Q·Kᵀ; the
// head dim is the N of O += P·V. Columns are FA3's register budget in mind: a consumer thread holds S
// (block_n/2 fp32), P (block_n/8 b32) and O (head_dim/2 fp32).
//
// | head_dim | block_m | block_n | stages | smem (Q + 2·stages K/V tiles)  | accumulator regs / thread |
// |    64    |   64    |   128   |   2    |  8 + 4·16 = 72 KiB             | 64 + 16 + 32 = 112        |
// |   128    |   64    |   128   |   2    | 16 + 4·32 = 144 KiB            | 64 + 16 + 64 = 144        |
// |   256    |   64    |    64   |   2    | 32 + 4·32 = 160 KiB            | 32 +  8 + 128 = 168       |
#pragma once

#include <cstdint>

namespace fa4::sm90 {

struct FwdTile {
  int head_dim;
  int block_m;  // query rows per CTA = 64 · consumer warpgroups
  int block_n;  // keys per K/V tile
  int stages;   // depth of the K ring and of the V ring
};

inline constexpr FwdTile kFwdTiles[] = {
    {64, 64, 128, 2},
    {128, 64, 128, 2},
    {256, 64, 64, 2},
};

constexpr FwdTile fwd_tile(int head_dim) {
  for (const FwdTile& t : kFwdTiles)
    if (t.head_dim == head_dim) return t;
  return FwdTile{0, 0, 0, 0};
}

inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kWgmmaM = 64;              // rows of one warpgroup's wgmma
inline constexpr int kSw128Columns = 64;        // 16-bit elements per 128-byte swizzled row (one TMA box width)
inline constexpr int kElementBytes = 2;         // bf16 / fp16
inline constexpr uint32_t kSmemPerBlockMax = 227 * 1024;  // sm_90 opt-in limit per CTA
inline constexpr uint32_t kSmemAlignSlack = 1024;         // dynamic smem is rounded up to the swizzle repeat

template <int HeadDim>
struct FwdConfig {
  static constexpr FwdTile kTile = fwd_tile(HeadDim);
  static_assert(kTile.head_dim == HeadDim, "no row for this head dim in kFwdTiles");

  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr int kConsumerWarpgroups = kBlockM / kWgmmaM;
  static constexpr int kProducerWarpgroups = 1;  // of which warp 0 works; the rest exit at once
  static constexpr int kThreads = kWarpgroupThreads * (kProducerWarpgroups + kConsumerWarpgroups);
  static constexpr int kHeadDimChunks = HeadDim / kSw128Columns;  // TMA boxes per tile, smem chunks per row

  static constexpr uint32_t kQTileBytes = uint32_t(kBlockM) * HeadDim * kElementBytes;
  static constexpr uint32_t kKvTileBytes = uint32_t(kBlockN) * HeadDim * kElementBytes;
  static constexpr uint32_t kTileBytes = kQTileBytes + 2u * kStages * kKvTileBytes;

  static_assert(kConsumerWarpgroups == 1, "the first kernel has exactly one consumer warpgroup");
  static_assert(kBlockM % kWgmmaM == 0, "block_m is whole warpgroups of 64 rows");
  static_assert(HeadDim % kSw128Columns == 0, "the head dim is whole 128-byte swizzle rows (64 elements)");
  static_assert(HeadDim % 16 == 0 && kBlockN % 16 == 0, "whole wgmma k-steps of 16 for both GEMMs");
  static_assert(kBlockN % 8 == 0 && kBlockN <= 256 && HeadDim <= 256, "wgmma N is a multiple of 8 in [8, 256]");
  static_assert(kBlockM <= 256 && kBlockN <= 256, "TMA boxes have at most 256 rows");
  static_assert(kQTileBytes % 1024 == 0 && kKvTileBytes % 1024 == 0,
                "every tile starts on the 1024-byte swizzle repeat (descriptor base offset 0)");
  static_assert(kTileBytes + 1024 + kSmemAlignSlack <= kSmemPerBlockMax,
                "tiles + barriers + alignment slack exceed the 227 KiB of shared memory per CTA");
  static_assert(kStages >= 2, "the ring needs two stages so loads overlap compute");
  // One consumer thread's accumulators: S (block_n/2), P fragments (block_n/8), O (head_dim/2). With a
  // 256-thread CTA (launch_bounds(256, 1)) ptxas may use 255 registers; leave room for addresses and state.
  static constexpr int kAccumulatorRegisters = kBlockN / 2 + kBlockN / 8 + HeadDim / 2;
  static_assert(kAccumulatorRegisters <= 184, "accumulators would leave too few registers (spills)");
  static_assert(65536 / kThreads >= 255, "one CTA per SM at full register budget");
};

}  // namespace fa4::sm90
