// The sm_90a forward kernel: sets up the barriers, then hands each warpgroup to its role. No math here; the
// roles live in load.cuh (TMA producer), mma_softmax.cuh (GEMMs, softmax, correction) and epilogue.cuh.
// Instantiated for the sm90 rows of src/cuda/instances.def, each behind a launch function for launch.cu.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "cuda/ptx/elect.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/sm90/epilogue.cuh"
#include "cuda/sm90/kernel_fwd.hpp"
#include "cuda/sm90/load.cuh"
#include "cuda/sm90/mma_softmax.cuh"
#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/trace_writers.hpp"
#include "cuda/trace/recorder.cuh"

namespace fa4::sm90 {
namespace {

// The role table: warpgroup 0 produces (its warp 0 issues TMA and walks the tiles; it gives registers back and
// its other three warps exit; F32's define gives warp 1 a paged call's V loads), warpgroups 1 .. block_m/64
// consume (64 query rows each) and take the registers.
enum class Role { load, mma_softmax_epilogue };

__device__ __forceinline__ Role role_of(int warpgroup) { return warpgroup == 0 ? Role::load : Role::mma_softmax_epilogue; }

// A consumer warpgroup: for every tile the producer publishes, the main loop and the epilogue.
template <ptx::WgmmaInput In, int Row, bool Varlen>
__device__ __forceinline__ void consumer_role(const FwdParams& p, FwdSharedStorage<Row>& smem, int consumer) {
  using Config = FwdConfig<Row>;
  const FwdRing<Row, kTileRingStages> tile_ring(smem.tile_ring);
  auto tile_stage = cuda::consumer_start_state<kTileRingStages>();
  ConsumerStages<Config::kStages> st;
  const bool o_in_q = p.out_tma && !Config::kSeparateOStaging;  // then the epilogue releases Q
  trace::Recorder rec(FA4_TRACE_SINK(p), fwd_trace_consumer_writer(consumer), threadIdx.x % kWarpgroupThreads == 0);
  for (;;) {
    FA4_TRACE_RECORD(rec, trace::Kind::wait_begin, trace::Wait::tile_slot);
    tile_ring.consumer_wait(tile_stage);
    FA4_TRACE_RECORD(rec, trace::Kind::wait_end, trace::Wait::tile_slot);
    // Lane 0 reads the slot, the warp takes the index by shuffle, then lane 0 releases the slot. One reader and
    // one arrival per warp (a thread each cost d = 64 13%, perf-log G8), and racecheck sees no read to pair
    // with the producer's next write. The release follows the shuffle so that every lane has finished its wait
    // on this phase of the slot before the producer can refill it.
    int32_t linear = 0;
    if (threadIdx.x % 32 == 0) linear = smem.tile_slot[tile_stage.index];
    linear = __shfl_sync(0xffffffffu, linear, 0);
    if (threadIdx.x % 32 == 0) tile_ring.consumer_release(tile_stage);
    ++tile_stage;
    if (linear >= p.order.num_tiles()) break;

    FA4_TRACE_RECORD(rec, trace::Kind::tile_begin, linear);
    const WorkTile tile = p.order.tile(linear);
    SeqGeometry geo;  // varlen: the tile's sequence; dense: unused (p's sizes and mask)
    const KvTileRange range = tile_kv_range<Config::kBlockM, Config::kBlockN, Varlen>(p, tile, geo);
    ptx::WgmmaAccumulator<Config::kHeadDim> o;
    RowState rows = initial_rows(p, tile.head);
    if (range.empty()) {  // every row fully masked (or seqlen_k == 0): O = 0, LSE = -inf (or the sink); nothing loaded
#pragma unroll
      for (int i = 0; i < Config::kHeadDim / 2; ++i) o.reg[i] = 0.0f;
      FA4_TRACE_RECORD(rec, trace::Kind::epilogue_begin, linear);
      epilogue_role<In, Row, Varlen>(p, geo, smem, tile, consumer, st, /*by_tma=*/false, /*release_q=*/false,
                                     /*no_key=*/true, o, rows, rec);
      FA4_TRACE_RECORD(rec, trace::Kind::epilogue_end, linear);
      FA4_TRACE_RECORD(rec, trace::Kind::tile_end, linear);
      continue;
    }
    mma_softmax_role<In, Row, Varlen>(p, geo, smem, tile, range, consumer, st, /*release_q=*/!o_in_q, o, rows, rec);
    FA4_TRACE_RECORD(rec, trace::Kind::epilogue_begin, linear);
    epilogue_role<In, Row, Varlen>(p, geo, smem, tile, consumer, st, p.out_tma, /*release_q=*/o_in_q,
                                   /*no_key=*/false, o, rows, rec);
    FA4_TRACE_RECORD(rec, trace::Kind::epilogue_end, linear);
    FA4_TRACE_RECORD(rec, trace::Kind::tile_end, linear);
    ++st.q;
  }
  FA4_TRACE_FINISH(rec);
  if (threadIdx.x % kWarpgroupThreads == 0) ptx::tma_store_wait<0>();  // stores read shared memory until done
  // Its one tile is its first, blockIdx's (scheduler.cuh); its range's partials are written above.
  if (p.cluster_combine) merge_tile_in_cluster<In, Row>(p, p.order.tile(int32_t(blockIdx.x)), consumer);
}

template <ptx::WgmmaInput In, int Row, bool Varlen>
__global__ void __launch_bounds__(FwdConfig<Row>::kThreads, 1) fwd_kernel(const __grid_constant__ FwdParams p) {
  using Config = FwdConfig<Row>;
  FwdSharedStorage<Row>& smem = ptx::sw128_aligned_dynamic_smem<FwdSharedStorage<Row>>();
  if (threadIdx.x == 0) {
    // K/V/Q fills complete by TMA bytes after the producer's single arrival, a tile index by the producer's
    // store-and-arrive. A stage is free once every consumer warp has released it: K/V/Q after its wgmma wait,
    // a tile slot after its lane 0 has read it.
    constexpr uint32_t kReleases = kReleasesPerConsumerWarpgroup * Config::kConsumerWarpgroups;
    cuda::Pipeline<Config::kStages>::init(smem.k_ring, 1, kReleases);
    cuda::Pipeline<Config::kStages>::init(smem.v_ring, 1, kReleases);
    cuda::Pipeline<1>::init(smem.q_ring, 1, kReleases);
    // F32's V warp reads every slot too (paged_v_warp: never in the default build).
    cuda::Pipeline<kTileRingStages>::init(smem.tile_ring, 1, kReleases + (paged_v_warp<Varlen>(p) ? 1u : 0u));
    // Whatever the stream launches next as a programmatic dependent may become resident now, on the SMs this grid
    // leaves free: split-KV's combine (split_combine.cu) or the next call's forward, each of which waits in
    // cudaGridDependencySynchronize until this grid is done and its writes are visible before touching global
    // memory, so their launch latency hides behind this kernel. (A caller's own PDL kernel must wait likewise;
    // a launch without the PDL attribute is not affected by the trigger.)
    cudaTriggerProgrammaticLaunchCompletion();
  }
  // Launched as a programmatic dependent of the stream's previous kernel (launch_fwd_kernel): its CTAs may be
  // resident before that kernel ends, and set up their barriers meanwhile; nothing here reads or writes global
  // memory (inputs it may be producing, outputs or a workspace it may still be reading) until it is done.
  cudaGridDependencySynchronize();
  __syncthreads();

  const int warpgroup = threadIdx.x / kWarpgroupThreads;
  if (role_of(warpgroup) == Role::load) {
    if constexpr (Config::kSetMaxNReg) ptx::setmaxnreg_dec<Config::kProducerRegisters>();
    if (threadIdx.x / 32 == 0)
      load_role<Row, Varlen>(p, smem);
    else if (threadIdx.x / 32 == 1 && paged_v_warp<Varlen>(p))
      v_load_role<Row>(p, smem);
    // The merge's cluster barrier (merge_tile_in_cluster): every thread of the cluster takes part, as in the
    // backward's pair (barrier.cluster waits for the threads that have not exited; this does not lean on that).
    if (p.cluster_combine) ptx::cluster_sync();
    return;
  }
  if constexpr (Config::kSetMaxNReg) ptx::setmaxnreg_inc<Config::kConsumerRegisters>();
  consumer_role<In, Row, Varlen>(p, smem, ptx::warp_uniform(warpgroup - 1));  // uniform: see warp_uniform
}

// Calls f(kernel, threads, dynamic smem bytes) with the kernel of (dtype, kFwdTiles row `row` of head dim
// HeadDim, varlen): two per row of that head dim (dense, and with per-sequence geometry). A variable-length batch
// runs the head dim's last row (any length, fwd_varlen_row); a KV-cache call the row its query length picks (a
// decode call the one-consumer d = 128 row).
template <DType Dtype, int HeadDim, int Row = 0, class F>
cudaError_t with_head_dim_row(int row, bool varlen, F&& f) {
  static_assert(fwd_row(HeadDim, 1) >= 0, "a head dim of instances.def has no row in kFwdTiles (config.hpp)");
  if constexpr (Row == kFwdRows) {
    return cudaErrorInvalidValue;
  } else {
    if constexpr (kFwdTiles[Row].head_dim == HeadDim) {
      if (row == Row) {
        constexpr auto In = wgmma_input<Dtype>();
        const uint32_t threads = FwdConfig<Row>::kThreads, smem = fwd_smem_bytes<Row>();
        return varlen ? f(fwd_kernel<In, Row, true>, threads, smem) : f(fwd_kernel<In, Row, false>, threads, smem);
      }
    }
    return with_head_dim_row<Dtype, HeadDim, Row + 1>(row, varlen, static_cast<F&&>(f));
  }
}

// Selection among the compiled (dtype, head dim) pairs: the X-macro keeps the sm90 forward rows of instances.def.
template <class F>
cudaError_t with_fwd_kernel(DType p_dtype, int p_head_dim, int row, bool varlen, F&& f) {
#define FA4_IF_sm90(...) __VA_ARGS__
#define FA4_IF_sm100(...)
#define FA4_IF_fwd(...) __VA_ARGS__
#define FA4_IF_bwd(...)
#define FA4_KERNEL(arch, pass, dtype, head_dim)                                      \
  FA4_IF_##arch(FA4_IF_##pass(if (p_dtype == DType::dtype && p_head_dim == head_dim) \
                                  return with_head_dim_row<DType::dtype, head_dim>(row, varlen, f);))
#include "cuda/instances.def"
  return cudaErrorInvalidValue;  // not a compiled row: selection refuses these before launch
}

// Clusters above the portable 8 CTAs need the kernel's opt-in, once per (kernel, device) in the process;
// `again`: set it even if this process did (a cudaDeviceReset forgets it).
cudaError_t opt_in_large_clusters(const void* kernel, bool again = false) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> opted;
  std::lock_guard<std::mutex> lock(mu);
  if (opted.count({kernel, device}) != 0 && !again) return cudaSuccess;
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      e != cudaSuccess)
    return e;
  opted.insert({kernel, device});
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_fwd_kernel(DType dtype, int head_dim, int row, bool varlen, const FwdParams& p, uint32_t grid,
                              uint32_t cluster, cudaStream_t stream) {
  return with_fwd_kernel(dtype, head_dim, row, varlen, [&](auto kernel, uint32_t threads, uint32_t smem) {
    if (cluster <= 8) return launch_with_dynamic_smem(kernel, grid, threads, smem, stream, p, cluster, true);
    const void* k = reinterpret_cast<const void*>(kernel);
    if (const cudaError_t e = opt_in_large_clusters(k); e != cudaSuccess) return e;
    cudaError_t e = launch_with_dynamic_smem(kernel, grid, threads, smem, stream, p, cluster, /*programmatic=*/true);
    if (e != cudaSuccess) {  // the opt-in may have been lost with a reset context
      (void)cudaGetLastError();
      if (opt_in_large_clusters(k, /*again=*/true) == cudaSuccess)
        e = launch_with_dynamic_smem(kernel, grid, threads, smem, stream, p, cluster, true);
    }
    return e;
  });
}

cudaError_t fwd_max_active_clusters(DType dtype, int head_dim, int row, bool varlen, uint32_t cluster, int* clusters) {
  *clusters = 0;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mu;
  static std::map<std::tuple<DType, int, int, bool, uint32_t, int>, int> known;
  const auto key = std::make_tuple(dtype, head_dim, row, varlen, cluster, device);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (const auto it = known.find(key); it != known.end()) return *clusters = it->second, cudaSuccess;
  }
  const cudaError_t e = with_fwd_kernel(dtype, head_dim, row, varlen, [&](auto kernel, uint32_t threads, uint32_t smem) {
    const void* k = reinterpret_cast<const void*>(kernel);
    if (const cudaError_t e = opt_in_dynamic_smem(k, smem); e != cudaSuccess) return e;
    if (cluster > 8)
      if (const cudaError_t e = opt_in_large_clusters(k); e != cudaSuccess) return e;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(cluster);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
  });
  if (e == cudaErrorInvalidClusterSize || e == cudaErrorInvalidValue || e == cudaErrorNotSupported) {
    (void)cudaGetLastError();  // a size this device does not run: the answer is none (and the call goes on)
    *clusters = 0;
  } else if (e != cudaSuccess) {
    return e;  // anything else is the caller's error to report, and not remembered
  }
  std::lock_guard<std::mutex> lock(mu);
  known[key] = *clusters;
  return cudaSuccess;
}

}  // namespace fa4::sm90
