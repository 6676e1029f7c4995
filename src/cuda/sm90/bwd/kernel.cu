// The sm_90a backward main kernel: sets up the barriers, then hands each warpgroup to its role. No math here;
// the roles live in load.cuh (TMA producer), mma.cuh (the five GEMMs, P and dS; dQ through dq_reduce.cuh),
// mma_wide.cuh (the same for the column-split rows, d = 192 and 256), dq_writer.cuh (the staged dQ slabs) and
// epilogue.cuh (dK, dV). Instantiated for the sm90 bwd rows of src/cuda/instances.def.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/elect.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/sm90/bwd/dq_exchange.cuh"
#include "cuda/sm90/bwd/dq_writer.cuh"
#include "cuda/sm90/bwd/epilogue.cuh"
#include "cuda/sm90/bwd/kernel.hpp"
#include "cuda/sm90/bwd/load.cuh"
#include "cuda/sm90/bwd/mma.cuh"
#include "cuda/sm90/bwd/mma_wide.cuh"
#include "cuda/sm90/bwd/shared_storage.cuh"
#include "cuda/sm90/bwd/work.cuh"
#include "cuda/sm90/launch_common.hpp"
#include "cuda/sm90/tiles.cuh"

namespace fa4::sm90 {
namespace {

// Warpgroup 0 produces (its warp 0 issues every load, its warp 1 adds the staged dQ slabs of key-split rows, its
// warps 2 and 3 help with the CTA pair's dQ exchange, or pass the deterministic turns of column-split rows
// (deterministic mode), or idle; it gives registers back); warpgroups 1 .. block_n/64 each own 64 keys (column-split
// rows: warpgroups 1 and 2 share them).
enum class BwdRole { load, mma_epilogue };
// Warps of the producer warpgroup: the load warp, the dQ writers (kDqWriterWarp + w), the pair's adders.
constexpr int kLoadWarp = 0, kDqWriterWarp = 1;
static_assert(kDqWriterWarp + kBwdMaxDqWriters <= 4, "the dQ writers are warps of the producer warpgroup");
__device__ __forceinline__ BwdRole bwd_role_of(int warpgroup) {
  return warpgroup == 0 ? BwdRole::load : BwdRole::mma_epilogue;
}

// Varlen: a CTA's key block and query tiles are its sequence's (work.cuh); never a CTA pair (the host refuses it).
template <ptx::WgmmaInput In, int Row, bool Varlen>
__global__ void __launch_bounds__(BwdConfig<Row>::kThreads, 1) bwd_kernel(const __grid_constant__ BwdParams p) {
  using Config = BwdConfig<Row>;
  BwdSharedStorage<Row>& smem = bwd_shared_storage<Row>();
  constexpr bool kPairCapable = Config::kPairCapable && !Varlen;
  const bool paired = kPairCapable && p.cluster_pair;
  if (threadIdx.x == 0) {
    // K/V and each Q stage fill by TMA bytes after the producer's single arrival; a Q stage is free once every
    // consumer thread has released it (after the wgmma wait that ends the GEMMs' reads, and its own LSE₂/D reads),
    // and, with the CTA pair, every warp of the peer's consumers (its producer fills half of this CTA's stage).
    constexpr uint32_t kConsumerThreads = kWarpgroupThreads * Config::kConsumerWarpgroups;
    // The K/V stage is refilled per work item once every consumer thread has released it (after its epilogue).
    cuda::Pipeline<1>::init(smem.kv_ring, 1, kConsumerThreads);
    cuda::Pipeline<Config::kStages>::init(smem.q_ring, 1, kConsumerThreads + (paired ? kConsumerThreads / 32 : 0u));
    if constexpr (Config::kPairCapable)
      for (int c = 0; c < Config::kConsumerWarpgroups; ++c) {
        // every lane of the dQ writer warp, and of the two helper warps when the pair exchanges dQ halves
        ptx::mbarrier_init(&smem.scratch.dq_empty[0][c], paired && p.pair_dq_exchange ? kDqAdderThreads : 32u);
        if constexpr (Config::kDetStagingBuffers == 2) ptx::mbarrier_init(&smem.scratch.dq_empty[1][c], 32u);
        ptx::mbarrier_init(&smem.scratch.dq_incoming_full[c], 1);  // this CTA's arrival + the peer's bytes
        ptx::mbarrier_init(&smem.scratch.dq_pushed_consumed[c], 1);  // the peer's arrival
      }
    ptx::fence_barrier_init();
    // A postprocess launched as a programmatic dependent (FA4_BWD_PDL) may become resident on the SMs this grid
    // frees (once every CTA has started) and waits in cudaGridDependencySynchronize until this grid is done. Only
    // then: a caller's own PDL kernel after a backward without a postprocess is not released early.
    if (p.programmatic) cudaTriggerProgrammaticLaunchCompletion();
  }
  __syncthreads();
  // Launched as a programmatic dependent of the stream's previous kernel (FA4_BWD_PDL: the preprocess, or the
  // sink gradient, which ran after it): the barriers above were set up while it drained; nothing reads or writes
  // global memory before it is done (LSE₂, D, the zeroed dQ accumulator and the turn counters are the
  // preprocess's). A no-op in a plain launch.
  cudaGridDependencySynchronize();
  if (paired) ptx::cluster_sync();  // the peer's barriers are initialised before anything signals them
  // Each role walks the CTA's work items itself (work.cuh, for_each_work_item).

  const int warpgroup = threadIdx.x / kWarpgroupThreads;
  if (bwd_role_of(warpgroup) == BwdRole::load) {
    ptx::setmaxnreg_dec<Config::kProducerRegisters>();
    const int warp = threadIdx.x / 32;
    if (warp == kLoadWarp) bwd_load_role<Row, Varlen>(p, smem);
    if constexpr (!Config::kColumnSplit) {
      if (warp >= kDqWriterWarp && warp < kDqWriterWarp + dq_writers(p))
        bwd_dq_writer_role<Row, Varlen>(p, smem, warp - kDqWriterWarp);
      if constexpr (kPairCapable)
        if (warp > kDqWriterWarp && paired && p.pair_dq_exchange) bwd_dq_adder_role<Row>(p, smem, warp - kDqWriterWarp);
    }
    // Deterministic turn helpers (column-split rows: p.det_turn_helpers; key-split rows: p.det_register_adds, and
    // then warp 2's writer role has returned at once).
    if (warp >= kTurnHelperWarp && warp < kTurnHelperWarp + Config::kConsumerWarpgroups)
      bwd_dq_turn_helper_role<Row, Varlen>(p, warp - kTurnHelperWarp);
    if (paired) ptx::cluster_sync();  // see below
    return;
  }
  ptx::setmaxnreg_inc<Config::kConsumerRegisters>();
  const int consumer = ptx::warp_uniform(warpgroup - 1);  // uniform registers for the descriptors built from it
  if constexpr (Config::kColumnSplit) {
    // The head-dim chunks split over the two warpgroups (the first takes the odd one at d = 192).
    constexpr int kChunks0 = Config::kWideChunks0, kChunks1 = Config::kHeadDimChunks - kChunks0;
    if (consumer == 0)
      bwd_wide_consumer<In, Row, kChunks0, Varlen>(p, smem, 0, 0);
    else
      bwd_wide_consumer<In, Row, kChunks1, Varlen>(p, smem, 1, kChunks0);
  } else {
    bwd_key_split_consumer<In, Row, Varlen>(p, smem, consumer);
  }
  // No CTA of a pair exits while its peer may still signal its barriers or copy into its shared memory.
  if (paired) ptx::cluster_sync();
}

// The rotated walk (p.rotated_walk) runs on a persistent cooperative grid: as many whole rounds of n_block_slots
// CTAs (one (batch, kv head) each at a time) as are resident at once, at most one per work item group. The
// kernel's CTAs per SM are asked once per instance (a driver query; the same on every sm_90a device), the SM
// count from the cached device attributes, so a call pays no query.
template <DType Dtype, int HeadDim>
cudaError_t launch_instance(const BwdParams& p, bool varlen, cudaStream_t stream) {
  constexpr int kRow = bwd_row(HeadDim);
  static_assert(kRow >= 0, "a bwd head dim of instances.def has no row in kBwdTiles (bwd/config.hpp)");
  auto* const kernel = varlen ? bwd_kernel<wgmma_input<Dtype>(), kRow, true> : bwd_kernel<wgmma_input<Dtype>(), kRow, false>;
  constexpr uint32_t kThreads = BwdConfig<kRow>::kThreads;
  constexpr uint32_t kSmem = bwd_smem_bytes<kRow>();
  uint32_t grid = uint32_t(p.work_items);
  if (p.rotated_walk) {
    static std::atomic<int> ctas_per_sm{0};  // per (dtype, head dim) instance; varlen never takes the walk
    int per_sm = ctas_per_sm.load(std::memory_order_relaxed);
    if (per_sm == 0) {
      if (const cudaError_t e = opt_in_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem); e != cudaSuccess)
        return e;
      if (const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, int(kThreads), kSmem);
          e != cudaSuccess)
        return e;
      ctas_per_sm.store(per_sm, std::memory_order_relaxed);
    }
    int device = 0;
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    const int64_t sms = device_attribute(device, cudaDevAttrMultiProcessorCount).value_or(0);
    const int64_t rounds = int64_t(per_sm) * sms / p.n_block_slots;
    if (rounds == 0) return cudaErrorCooperativeLaunchTooLarge;  // the host's path choice rules this out
    grid = uint32_t(std::min<int64_t>(rounds * p.n_block_slots, p.work_items));
  }
  return launch_with_dynamic_smem(kernel, grid, kThreads, kSmem, stream, p, !varlen && p.cluster_pair ? 2u : 1u,
                                  p.programmatic, p.rotated_walk);
}

}  // namespace

#define FA4_IF_sm90(...) __VA_ARGS__
#define FA4_IF_sm100(...)
#define FA4_IF_fwd(...)
#define FA4_IF_bwd(...) __VA_ARGS__
#define FA4_KERNEL(arch, pass, dtype, head_dim)                                      \
  FA4_IF_##arch(FA4_IF_##pass(if (p_dtype == DType::dtype && p_head_dim == head_dim) \
                                  return launch_instance<DType::dtype, head_dim>(p, varlen, stream);))

cudaError_t launch_bwd_kernel(DType p_dtype, int p_head_dim, const BwdParams& p, bool varlen, cudaStream_t stream) {
#include "cuda/instances.def"
  return cudaErrorInvalidValue;  // not a compiled row: selection refuses these before launch
}

}  // namespace fa4::sm90
