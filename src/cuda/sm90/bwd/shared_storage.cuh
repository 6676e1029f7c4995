// The backward main kernel's shared memory: the CTA's K and V tiles (loaded once), the Q/dO/LSE₂/D ring, the
// two dSᵀ buffers (written by the consumers, read by dQ = dS·K) and each consumer's dQ staging for the bulk
// reduce-add (column-split rows: two Pᵀ buffers instead). Q, dO, K, V are the TMA image [head_dim/64 chunks][rows][128 B], 128B-swizzled; dSᵀ is
// [block_m/64 query chunks][block_n keys][128 B], the same swizzle, read MN-major as wgmma's A.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda/pipeline/pipeline.cuh"
#include "cuda/ptx/swizzle.hpp"
#include "cuda/sm90/bwd/config.hpp"

namespace fa4::sm90 {

// A ring of the backward kernel of row Row: its waits take the row's suspend hint (BwdConfig::kWaitSuspendHintNs).
template <int Row, int Stages>
using BwdRing = cuda::Pipeline<Stages, BwdConfig<Row>::kWaitSuspendHintNs>;

// What the two row kinds keep beside dSᵀ: each warpgroup's dQ staging buffer (key-split rows), or Pᵀ (column-split
// rows: both warpgroups read all of it as dV's A operand), double-buffered like dSᵀ.
// With the CTA pair, dq_incoming receives the half of each slab that this CTA adds for both (the peer's bulk
// copy completes dq_incoming_full); dq_pushed_consumed tells that the peer has added the half pushed to it.
// Deterministic mode without the pair, on rows with two staging buffers: dq_staging_second (in dq_incoming's
// memory) is the second dQ writer's buffer (dq_staging_buffer).
template <class Config>
struct DqStaging {
  static constexpr int kSecondFloats = Config::kDetStagingBuffers == 2 ? Config::kDqStagingBytes / 4 : 4;
  alignas(16) float dq_staging[Config::kConsumerWarpgroups][Config::kDqStagingBytes / 4];
  // [buffer][warpgroup]: the writer has read the slab (32 lane arrivals)
  alignas(8) uint64_t dq_empty[Config::kDetStagingBuffers][Config::kConsumerWarpgroups];
  union {
    alignas(16) float dq_incoming[Config::kConsumerWarpgroups][Config::kDqHalfBytes / 4];
    alignas(16) float dq_staging_second[Config::kConsumerWarpgroups][kSecondFloats];
  };
  alignas(8) uint64_t dq_incoming_full[Config::kConsumerWarpgroups];
  alignas(8) uint64_t dq_pushed_consumed[Config::kConsumerWarpgroups];
};
template <class Config>
struct PtBuffers {
  alignas(ptx::kSw128Alignment) uint8_t pt[2][Config::kDsTileBytes];
};

template <int Row>
struct BwdSharedStorage {
  using Config = BwdConfig<Row>;
  alignas(ptx::kSw128Alignment) uint8_t k[Config::kKvTileBytes];
  alignas(ptx::kSw128Alignment) uint8_t v[Config::kKvTileBytes];
  alignas(ptx::kSw128Alignment) uint8_t q[Config::kStages][Config::kQTileBytes];
  alignas(ptx::kSw128Alignment) uint8_t dout[Config::kStages][Config::kQTileBytes];
  // dSᵀ alternates between two buffers: a warpgroup writes tile t + 1's while another may still read tile t's
  // in its dQ GEMM; the ds_ready barrier of tile t + 1 orders the reuse at t + 2.
  alignas(ptx::kSw128Alignment) uint8_t ds[2][Config::kDsTileBytes];
  std::conditional_t<Config::kColumnSplit, PtBuffers<Config>, DqStaging<Config>> scratch;
  alignas(16) float lse_log2[Config::kStages][Config::kBlockM];
  alignas(16) float dsum[Config::kStages][Config::kBlockM];
  cuda::PipelineBarriers<1> kv_ring;                 // load -> mma: K and V landed / free (once per work item)
  cuda::PipelineBarriers<Config::kStages> q_ring;    // load -> mma: Q, dO, LSE₂, D of a query tile landed / free
};

template <int Row>
constexpr uint32_t bwd_smem_bytes() {
  return uint32_t(sizeof(BwdSharedStorage<Row>)) + (BwdConfig<Row>::kAlignedSmemBase ? 0u : kSmemAlignSlack);
}

#if defined(__CUDACC__)
// The kernel's shared storage: at the dynamic shared memory base rounded up to the swizzle repeat (the launch adds
// the slack), or, for a row without the slack, at the base itself, which must then be aligned already.
template <int Row>
__device__ __forceinline__ BwdSharedStorage<Row>& bwd_shared_storage() {
  if constexpr (BwdConfig<Row>::kAlignedSmemBase)
    return ptx::sw128_dynamic_smem_at_base<BwdSharedStorage<Row>>();
  else
    return ptx::sw128_aligned_dynamic_smem<BwdSharedStorage<Row>>();
}
#endif


template <int... Rows>
constexpr bool every_bwd_row_fits(std::integer_sequence<int, Rows...>) {
  return ((bwd_smem_bytes<Rows>() <= kSmemPerBlockMax) && ...);
}
static_assert(every_bwd_row_fits(std::make_integer_sequence<int, kBwdRows>{}),
              "a backward tile-table row does not fit the 227 KiB of shared memory");

}  // namespace fa4::sm90
