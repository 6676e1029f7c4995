// The forward kernel's shared memory: the Q tile, the K and V rings, and their barriers. Every tile is stored
// as [head_dim / 64 chunks][rows][128 bytes], 128B-swizzled, exactly as TMA writes it and wgmma reads it
// (reference/fa3.md §3.2, §3.3): K and V tiles are the same image, only the wgmma descriptor differs.
#pragma once

#include <cstdint>
#include <utility>

#include "cuda/pipeline/pipeline.cuh"
#include "cuda/ptx/swizzle.hpp"
#include "cuda/sm90/config.hpp"

namespace fa4::sm90 {

inline constexpr int kTileRingStages = 2;  // tile indices published ahead by the producer

template <int Row>
struct FwdSharedStorage {
  using Config = FwdConfig<Row>;
  alignas(ptx::kSw128Alignment) uint8_t q[Config::kQTileBytes];
  alignas(ptx::kSw128Alignment) uint8_t k[Config::kStages][Config::kKvTileBytes];
  alignas(ptx::kSw128Alignment) uint8_t v[Config::kStages][Config::kKvTileBytes];
  // O staging for the TMA store, same image as Q ([head_dim/64][block_m][128 B]); 1 byte when O uses Q's rows.
  alignas(ptx::kSw128Alignment) uint8_t o[Config::kSeparateOStaging ? Config::kOTileBytes : 1];
  cuda::PipelineBarriers<Config::kStages> k_ring;  // load -> mma: K tile landed / consumers done with it
  cuda::PipelineBarriers<Config::kStages> v_ring;  // load -> mma: V tile landed / consumers done with it
  cuda::PipelineBarriers<1> q_ring;                // load -> mma: Q landed / every consumer done with it
  cuda::PipelineBarriers<kTileRingStages> tile_ring;  // load -> mma: the next work tile's index is published
  int32_t tile_slot[kTileRingStages];              // linear tile index; >= num_tiles: no more work
};

// A ring of row Row's kernel, over one of the barrier sets above: its waits take the row's suspend hint.
template <int Row, int Stages>
using FwdRing = cuda::Pipeline<Stages, FwdConfig<Row>::kWaitSuspendHintNs>;

// Bytes to request at launch: the struct plus the slack that lets the kernel round the base up to 1024.
template <int Row>
constexpr uint32_t fwd_smem_bytes() {
  return uint32_t(sizeof(FwdSharedStorage<Row>)) + kSmemAlignSlack;
}

#if defined(__CUDACC__)
// Where consumer warpgroup `consumer` stages its 64 rows of O (chunks block_m·128 bytes apart, as in Q).
template <int Row>
__device__ __forceinline__ uint8_t* o_staging(FwdSharedStorage<Row>& smem, int consumer) {
  uint8_t* base = FwdConfig<Row>::kSeparateOStaging ? smem.o : smem.q;
  return base + consumer * kWgmmaM * ptx::kSw128RowBytes;
}

#endif

template <int Row>
constexpr bool fwd_smem_fits() {
  return fwd_smem_bytes<Row>() <= kSmemPerBlockMax;
}
template <int... Rows>
constexpr bool every_fwd_row_fits(std::integer_sequence<int, Rows...>) {
  return (fwd_smem_fits<Rows>() && ...);
}
static_assert(every_fwd_row_fits(std::make_integer_sequence<int, kFwdRows>{}),
              "a tile-table row does not fit the 227 KiB of shared memory");

}  // namespace fa4::sm90
