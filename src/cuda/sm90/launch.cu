// Host side of the sm_90a forward: tensor maps, kernel parameters, grid; launch on the caller's stream.
#include "cuda/sm90/launch.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "cuda/sm90/config.hpp"
#include "cuda/sm90/decode.hpp"
#include "cuda/sm90/kvcache_append.hpp"
#include "cuda/sm90/kernel_fwd.hpp"
#include "cuda/sm90/launch_common.hpp"
#include "cuda/sm90/split_combine.hpp"
#include "cuda/tensormap.hpp"
#if FA4_TRACE
#include "cuda/sm90/trace_writers.hpp"
#include "cuda/trace/launch_sink.hpp"
#endif

#ifndef FA4_AB_VARLEN_LPT
#define FA4_AB_VARLEN_LPT 0
#endif

namespace fa4::sm90 {
namespace {

constexpr int64_t kMaxIndex = (int64_t{1} << 31) - 1;

[[noreturn]] void unsupported(const char* call, const std::string& arg, const std::string& expected,
                              const std::string& got) {
  throw Error(Status::unsupported,
              std::string(call) + ": argument '" + arg + "': expected " + expected + ", got " + got);
}

}  // namespace

// A dimension TMA does not step through: broadcast (stride 0) or of size 1. Mapped with extent 1, coordinate 0.
static bool collapsed(const Tensor& t, int dim) { return t.stride[dim] == 0 || t.shape[dim] == 1; }

CoordSteps map_tensor(const Tensor& t, int64_t head_dim, uint32_t box_rows, CUtensorMap* map) {
  cuda::TmaTensorSpec spec;
  spec.data = t.data;
  spec.dtype = t.dtype;
  spec.rank = 4;
  spec.swizzle = cuda::TmaSwizzle::b128;
  const int64_t es = int64_t(element_size(t.dtype));
  // {head_dim, seqlen, heads, batch}, innermost first; a collapsed dim has extent 1 and a stride that only has to
  // be legal (it is never stepped).
  spec.dims = {uint64_t(head_dim), uint64_t(t.shape[kSeq]), collapsed(t, kHeads) ? 1u : uint64_t(t.shape[kHeads]),
               collapsed(t, kBatch) ? 1u : uint64_t(t.shape[kBatch])};
  spec.strides_bytes = {uint64_t(es), uint64_t(t.stride[kSeq] * es),
                        collapsed(t, kHeads) ? 16u : uint64_t(t.stride[kHeads] * es),
                        collapsed(t, kBatch) ? 16u : uint64_t(t.stride[kBatch] * es)};
  if (t.shape[kSeq] == 1) spec.strides_bytes[1] = 16;  // one row: never stepped, any legal stride
  spec.box = {uint32_t(kSw128Columns), box_rows, 1u, 1u, 1u};
  cuda::make_tma_tensor_map(spec, map);
  return {collapsed(t, kHeads) ? 0 : 1, collapsed(t, kBatch) ? 0 : 1};
}

bool has_forward_kernel(DType dtype, int64_t head_dim) {
#define FA4_IF_sm90(...) __VA_ARGS__
#define FA4_IF_sm100(...)
#define FA4_IF_fwd(...) __VA_ARGS__
#define FA4_IF_bwd(...)
#define FA4_KERNEL(arch, pass, kdtype, kd) FA4_IF_##arch(FA4_IF_##pass(if (dtype == DType::kdtype && head_dim == kd) return true;))
#include "cuda/instances.def"
  return false;
}

bool has_backward_kernel(DType dtype, int64_t head_dim) {
#undef FA4_IF_fwd
#undef FA4_IF_bwd
#define FA4_IF_fwd(...)
#define FA4_IF_bwd(...) __VA_ARGS__
#define FA4_KERNEL(arch, pass, kdtype, kd) FA4_IF_##arch(FA4_IF_##pass(if (dtype == DType::kdtype && head_dim == kd) return true;))
#include "cuda/instances.def"
  return false;
}

cudaError_t opt_in_dynamic_smem(const void* kernel, uint32_t smem, bool again) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, uint32_t> opted;  // (kernel, device) -> bytes opted in
  std::lock_guard<std::mutex> lock(mu);
  uint32_t& done = opted[{kernel, device}];
  if (done >= smem && !again) return cudaSuccess;
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      e != cudaSuccess)
    return e;
  done = smem;
  return cudaSuccess;
}

bool env_switch(const char* call, const char* name, bool fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  const std::string value(env);
  if (value == "0" || value == "1") return value == "1";
  throw Error(Status::invalid_argument,
              std::string(call) + ": environment " + name + ": expected 0 or 1, got '" + value + "'");
}

std::optional<int> device_attribute(int index, cudaDeviceAttr attr) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::optional<int>> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto [it, fresh] = cache.try_emplace({index, int(attr)});
  if (fresh) {
    int value = 0;
    if (cudaDeviceGetAttribute(&value, attr, index) == cudaSuccess)
      it->second = value;
    else
      cudaGetLastError();  // clear a "no device" error
  }
  return it->second;
}

bool device_is_sm90(int index) {
  return device_attribute(index, cudaDevAttrComputeCapabilityMajor) == 9 &&
         device_attribute(index, cudaDevAttrComputeCapabilityMinor) == 0;
}

std::vector<int32_t> read_device_ints(const char* call, const char* arg, const int32_t* data, int64_t n,
                                      int device_index, Stream stream) {
  std::vector<int32_t> host(size_t(std::max<int64_t>(n, 0)));
  if (n <= 0) return host;
  const DeviceGuard device(call, device_index);
  const cudaStream_t cu_stream = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  throw_if_cuda_error(call, cudaStreamIsCapturing(cu_stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    throw Error(Status::invalid_argument,
                std::string(call) + ": argument 'options.validate_device_metadata': expected false (or FA4_VALIDATE "
                                    "unset) while the stream is captured into a CUDA graph (checking '" + arg +
                                    "' copies it to the host and synchronizes), got true");
  throw_if_cuda_error(call, cudaMemcpyAsync(host.data(), data, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, cu_stream),
                      (std::string("copying ") + arg + " to the host").c_str());
  throw_if_cuda_error(call, cudaStreamSynchronize(cu_stream), (std::string("copying ") + arg + " to the host").c_str());
  return host;
}

bool tma_addressable(const Tensor& t) {
  try {
    check_tma_layout("", "", t);
    return true;
  } catch (const Error&) {
    return false;
  }
}

void check_tma_layout(const char* call, const char* name, const Tensor& t) {
  const std::string n(name);
  if (t.numel() == 0) return;  // nothing is loaded
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    unsupported(call, n, "a 16-byte aligned data pointer (the sm_90 kernel loads with TMA)",
                "address " + std::to_string(reinterpret_cast<uintptr_t>(t.data)) + " (" +
                    std::to_string(reinterpret_cast<uintptr_t>(t.data) % 16) + " bytes past 16-byte alignment)");
  const int64_t es = int64_t(element_size(t.dtype));
  const char* dim_names[3] = {"batch", "seqlen", "heads"};
  for (int dim : {kBatch, kSeq, kHeads}) {
    const std::string arg = n + ".stride[" + std::to_string(dim) + "]";
    const int64_t s = t.stride[dim];
    if (t.shape[dim] == 1) continue;  // never stepped
    if (s < 0)
      unsupported(call, arg, std::string("a non-negative ") + dim_names[dim] + " stride (TMA cannot walk backwards)",
                  std::to_string(s));
    if (s == 0 && dim == kSeq)
      unsupported(call, arg, "a non-zero seqlen stride (a broadcast sequence cannot be tiled by TMA)", "0");
    if (s % (16 / es) != 0)
      unsupported(call, arg,
                  "a multiple of " + std::to_string(16 / es) + " elements (16 bytes; the sm_90 kernel loads " +
                      dim_names[dim] + " steps with TMA)",
                  std::to_string(s));
    if (s * es >= (int64_t{1} << 40)) unsupported(call, arg, "a stride below 2^40 bytes (TMA)", std::to_string(s));
  }
  if (t.shape[kSeq] > kMaxIndex || t.shape[kHeads] > kMaxIndex || t.shape[kBatch] > kMaxIndex)
    unsupported(call, n, "batch, seqlen and heads below 2^31 each", "shape [" + std::to_string(t.shape[0]) + ", " +
                                                                       std::to_string(t.shape[1]) + ", " +
                                                                       std::to_string(t.shape[2]) + ", ...]");
}


namespace {
thread_local int forced_fwd_row = -1;  // ScopedFwdRow's choice on this thread; -1: none
}  // namespace

ScopedFwdRow::ScopedFwdRow(int row) : previous_(forced_fwd_row) { forced_fwd_row = row; }
ScopedFwdRow::~ScopedFwdRow() { forced_fwd_row = previous_; }

namespace {

// What one forward call runs: the tile-table row, the tiles' view of the problem, and the split-KV count.
// GQA packing (decode): with one query per sequence and no left window, the `group` query heads that share a kv
// head become the rows of one tile — q [b, 1, h_q, d] is read as [b, group, h_kv, d] (rows step over heads), out
// and lse likewise — so each K/V tile is loaded once per group instead of once per query head. Bottom-right
// causal and a right window hide no key from a row that is the last query, so only a left window stops it. A
// sink is per query head, so packing with sinks waits for split-KV's combine (which runs on the unpacked view).
struct FwdPlan {
  int row = -1;
  bool pack_gqa = false;
  int64_t heads = 0, seqlen_q = 0, group = 1;  // the tiles' view: heads of the walk, rows per head, q heads per k head
  int64_t num_m_blocks = 0, num_tiles = 0;     // tiles before the split
  int32_t splits = 1;         // the forward kernel's key ranges
  int32_t decode_splits = 0;  // the decode kernel's where the problem is one it takes (decode_kernel_takes), else 0
};

// Split count: the caller's (fewer when there are fewer key tiles), or with 0 the fill rule: when the tiles
// cannot fill the SMs, as many ranges as fill them (at most kMaxSplits), a range at least two key tiles (one with
// one query: at 1k keys 8 ranges of one tile took 10.8 µs where 4 of two took 11.6; perf-log F27).
constexpr int64_t kMaxSplits = 64;

// The decode kernel's problems, as far as the problem tells (decode_kernel_applies adds the tensors' addresses).
bool decode_kernel_takes(const detail::Problem& p) {
  return has_decode_kernel(p.dtype, p.head_dim) && p.seqlen_q == 1 && p.group() <= kDecodeMaxRows &&
         p.mask.left < 0 && p.sinks == nullptr && p.exp2_emulated_per16 == 0 && p.seqlen_k > 0;
}

// The decode kernel's key ranges (CTAs: ranges · heads_kv · batch, decode_planned_ctas_per_sm fit an SM; a range at least
// one 64-key chunk). The caller's count, or with 0: when the (kv head, sequence) pairs fill at most half the SMs,
// as many ranges as give each SM one CTA (latency-bound: b = 1 4k, 16 ranges 12.9 µs, 32 ranges 16.8); else the
// fewest ranges that give every SM two CTAs at least and no second wave that leaves SMs idle (between one and one
// and a half waves). H100, forced splits (F27): b = 16 8k 1 range 79% of copy, 3 ranges 98%; b = 32 16k 1 or 2
// (1.3 waves) 89%, 3 101%; b = 64 32k 1 (1.3 waves) 90%, 2-4 101-103%; b = 8 4k 2 ranges best (4: -3%).
int32_t decode_splits(const detail::Problem& p, int64_t sms) {
  const int64_t chunks = (p.seqlen_k + kDecodeChunkKeys - 1) / kDecodeChunkKeys;
  const int64_t pairs = std::max<int64_t>(p.batch * p.heads_kv, 1), slots = decode_planned_ctas_per_sm(p.head_dim) * sms;
  int64_t splits = p.num_splits;
  if (splits == 0 && 2 * pairs <= sms) splits = std::min(sms / pairs, kMaxSplits);
  if (splits == 0) {
    splits = 1;
    auto fits = [&](int64_t ctas) { return ctas >= 2 * sms && !(ctas > slots && 2 * ctas < 3 * slots); };
    while (splits < kMaxSplits && !fits(pairs * splits)) ++splits;
  }
  return int32_t(std::clamp<int64_t>(std::min(splits, chunks), 1, kMaxIndex));
}

FwdPlan plan_forward(const detail::Problem& p) {
  FwdPlan plan;
  const int64_t sms = std::max(1, device_attribute(p.device_index, cudaDevAttrMultiProcessorCount).value_or(1));
  auto view = [&](bool pack) {
    plan.pack_gqa = pack;
    plan.group = pack ? 1 : p.group();
    plan.heads = pack ? p.heads_kv : p.heads_q;
    plan.seqlen_q = pack ? p.group() : p.seqlen_q;
    plan.row = forced_fwd_row >= 0 ? forced_fwd_row : fwd_row(int(p.head_dim), plan.seqlen_q);
    if (plan.row < 0 || plan.row >= kFwdRows) return;
    const FwdTile& tile = kFwdTiles[plan.row];
    plan.num_m_blocks = (plan.seqlen_q + tile.block_m - 1) / tile.block_m;
    plan.num_tiles = plan.num_m_blocks * plan.heads * p.batch;
    const int64_t key_tiles = (p.seqlen_k + tile.block_n - 1) / tile.block_n;
    int64_t splits = p.num_splits;
    if (splits == 0)
      splits = plan.num_tiles >= sms ? 1
                                     : std::min({sms / std::max<int64_t>(plan.num_tiles, 1),
                                                 p.seqlen_q == 1 ? key_tiles : key_tiles / 2, kMaxSplits});
    plan.splits = int32_t(std::clamp<int64_t>(std::min(splits, key_tiles), 1, kMaxIndex));
  };
  const bool packable = p.seqlen_q == 1 && p.group() > 1 && p.mask.left < 0 && p.q_heads_strided;
  view(packable);
  if (plan.pack_gqa && p.sinks != nullptr && plan.splits == 1) view(false);
  if (decode_kernel_takes(p)) plan.decode_splits = decode_splits(p, sms);
  return plan;
}

// The split partials in a workspace, per (split, batch, head, query row): O (fp32 rows of head_dim), then, from
// the next 256-byte boundary, the LSEs (fp32).
struct SplitWorkspaceLayout {
  size_t lse_offset = 0, bytes = 0;
};
SplitWorkspaceLayout split_workspace_layout(const detail::Problem& p, int32_t splits) {
  SplitWorkspaceLayout l;
  if (splits <= 1) return l;
  const size_t rows = size_t(splits) * size_t(p.batch) * size_t(p.heads_q) * size_t(p.seqlen_q);
  l.lse_offset = (rows * size_t(p.head_dim) * 4 + 255) / 256 * 256;
  l.bytes = l.lse_offset + rows * 4;
  return l;
}
// What a call's workspace must hold: the partials of either kernel's ranges (decode_kernel_applies, and so the
// kernel, also depends on the tensors' addresses and strides, which a workspace query may not know).
size_t split_workspace_bytes(const detail::Problem& p, const FwdPlan& plan) {
  return split_workspace_layout(p, std::max(plan.splits, plan.decode_splits)).bytes;
}

// t [b, 1, h_q, d] (or lse [b, h_q, 1]) read as [b, group, h_kv, d] ([b, h_kv, group]): the packed view.
Tensor packed_rows(const Tensor& t, int64_t group) {
  Tensor r = t;
  r.shape[kSeq] = group;
  r.stride[kSeq] = t.stride[kHeads];
  r.shape[kHeads] = t.shape[kHeads] / group;
  r.stride[kHeads] = t.stride[kHeads] * group;
  return r;
}
Tensor packed_lse(const Tensor& t, int64_t group) {  // lse dims: [batch, heads, seqlen]
  Tensor r = t;
  r.shape[2] = group;
  r.stride[2] = t.stride[1];
  r.shape[1] = t.shape[1] / group;
  r.stride[1] = t.stride[1] * group;
  return r;
}

}  // namespace

size_t forward_workspace_bytes(const detail::Problem& p) {
  if (p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0 || !has_forward_kernel(p.dtype, p.head_dim)) return 0;
  return split_workspace_bytes(p, plan_forward(p));
}

namespace {

// LPT sections: as many (batch, head) pairs as have K and V (seqlen_k keys each) together in half of L2.
int32_t lpt_section(const detail::Problem& p, int64_t seqlen_k, int64_t pairs, int device_index) {
  const int64_t kv_bytes = std::max<int64_t>(1, 2 * seqlen_k * p.head_dim * int64_t(element_size(p.dtype)));
  const int64_t l2_bytes = device_attribute(device_index, cudaDevAttrL2CacheSize).value_or(0);
  return int32_t(std::clamp<int64_t>(l2_bytes / 2 / kv_bytes, 1, std::max<int64_t>(pairs, 1)));
}

// The forward's A/B environment switches, read at the start of every call that has rows to compute (so a bad value
// is refused whatever the mask), before anything is allocated or recorded:
//   FA4_FWD_PROLOGUE_TURN (default 1): a consumer's first S of a work tile waits for its turn at the tensor core;
//     0 issues it outside the turns (FlashAttention-3's and -4's order, perf-log F14), so consumer 0 starts the
//     next tile while the last consumer still runs this one's tail and epilogue.
//   FA4_FWD_CLUSTER_COMBINE (default 0; perf-log F17): 1 merges split-KV's ranges inside the forward where a tile's
//     ranges can run as one cluster (merges_in_cluster), instead of the combine kernel.
//   FA4_FWD_VARLEN_COUNTER (default 1; perf-log F24): a variable-length batch's tiles handed out by the tile
//     counter; 0 walks them in a fixed stride.
//   FA4_FWD_DECODE_KERNEL (default 3; perf-log F27, F36): a call decode_kernel_applies to runs on the decode
//     kernel (decode.cu) instead of the forward kernel's decode row where its key ranges are short (at most
//     kDecodeMaxRangeKeys keys each) and the forward kernel's own plan splits the keys too (3: plan.splits > 1, the
//     caller's count or its tiles at most half the SMs; a larger batch runs unsplit on the forward kernel, 3-13%
//     faster on the H100 at b = 16-128), or wherever its ranges are short (1, F27's rule), or always (2), or never
//     (0); its ranges are merged by the combine kernel, whatever FA4_FWD_CLUSTER_COMBINE says (that merge is the
//     forward kernel's).
//   FA4_FWD_DECODE_APPEND (perf-log F33; default 1 where the build's decode kernel appends, kDecodeAppends, and
//     refused as 1 where it does not): a KV-cache call on the decode kernel appends its new keys in that kernel
//     (decode_kernel_appends); 0 launches the append kernel before it, as the forward kernel's calls do.
struct FwdSwitches {
  bool prologue_turn = true;
  bool cluster_combine = false;
  bool varlen_counter = true;  // a variable-length batch's tiles handed out by the counter (scheduler.cuh; F24)
  enum class DecodeKernel { never, short_ranges, always, short_ranges_where_split } decode_kernel =
      DecodeKernel::short_ranges_where_split;
  bool decode_append = kDecodeAppends;  // the decode kernel appends a KV-cache call's new keys (decode_kernel_appends)
};
FwdSwitches::DecodeKernel decode_kernel_switch(const char* call) {
  const char* env = std::getenv("FA4_FWD_DECODE_KERNEL");
  const std::string value = env != nullptr ? env : "";
  if (value.empty() || value == "3") return FwdSwitches::DecodeKernel::short_ranges_where_split;
  if (value == "0") return FwdSwitches::DecodeKernel::never;
  if (value == "1") return FwdSwitches::DecodeKernel::short_ranges;
  if (value == "2") return FwdSwitches::DecodeKernel::always;
  throw Error(Status::invalid_argument,
              std::string(call) + ": environment FA4_FWD_DECODE_KERNEL: expected 0, 1, 2 or 3, got '" + value + "'");
}
// An environment switch of a feature a build may lack: default `built`, and "1" refused by name where it is not.
bool build_switch(const char* call, const char* name, bool built, const char* why_not) {
  const bool on = env_switch(call, name, built);
  if (on && !built)
    throw Error(Status::invalid_argument, std::string(call) + ": environment " + name + ": expected 0 or unset in " +
                                              "this build (" + why_not + "), got '1'");
  return on;
}
FwdSwitches read_fwd_switches(const char* call) {
  return {env_switch(call, "FA4_FWD_PROLOGUE_TURN", true), env_switch(call, "FA4_FWD_CLUSTER_COMBINE", false),
          env_switch(call, "FA4_FWD_VARLEN_COUNTER", true), decode_kernel_switch(call),
          build_switch(call, "FA4_FWD_DECODE_APPEND", kDecodeAppends,
                       "its decode kernel does not append: built with -DFA4_AB_DECODE_APPEND=0 or "
                       "-DFA4_AB_DECODE_WARP_RINGS=1")};
}

// Split-KV merged inside the forward (FwdParams::cluster_combine) rather than by the combine kernel: a tile's
// ranges must form one cluster (at most kMaxClusterCombine, 16 being the largest cluster sm_90 runs), each CTA one
// range, so every tile once in the grid (no more CTAs than SMs), and the device must run all the clusters at once
// (a GPC with fewer free SMs than a cluster holds none: a second wave would cost more than the combine kernel).
// Both merges run the same function on the same partials: the same bits.
constexpr int64_t kMaxClusterCombine = 16;
bool merges_in_cluster(const char* call, const FwdSwitches& switches, const detail::Problem& p, int row, bool varlen,
                       int32_t splits, int64_t ctas, int64_t sms) {  // ctas: tiles · splits, one CTA each
  if (!switches.cluster_combine || splits < 2 || splits > kMaxClusterCombine || ctas > sms) return false;
  int clusters = 0;
  throw_if_cuda_error(call, fwd_max_active_clusters(p.dtype, int(p.head_dim), row, varlen, uint32_t(splits), &clusters),
                      "cluster occupancy query");
  return clusters >= ctas / splits;
}

// The switches into the kernel parameters, and the tile counter (the LPT order's, params.order.lpt, or a
// variable-length batch's: `counted`) in stream-ordered memory: zeroed, used and freed in stream order, so
// concurrent calls on other streams never share it, and CUDA-graph capture records it as allocation/memset nodes.
void apply_switches_and_zero_tile_counter(const char* call, const FwdSwitches& switches, FwdParams& params,
                                          cudaStream_t stream, std::optional<StreamOrderedBuffer>& counter,
                                          bool counted = false) {
  params.prologue_turn = switches.prologue_turn;
  if (!params.order.lpt && !counted) return;
  counter.emplace(call, sizeof(uint32_t), stream, "the 4-byte tile counter");
  params.tile_counter = static_cast<uint32_t*>(counter->get());
  throw_if_cuda_error(call, cudaMemsetAsync(params.tile_counter, 0, sizeof(uint32_t), stream),
                      "cudaMemsetAsync of the tile counter");
}

// A KV-cache call's new keys and values into the caches (the copy kernel; nothing without k_new).
void append_new_keys(const char* call, const Tensor& k_cache, const Tensor& v_cache, const KvCacheArgs& cache,
                     cudaStream_t stream) {
  if (cache.k_new == nullptr || cache.seqlen_new == 0) return;
  throw_if_cuda_error(call,
                      launch_kvcache_append(k_cache, v_cache, *cache.k_new, *cache.v_new, cache.cache_seqlens,
                                            cache.page_table, cache.max_pages, cache.page_size, stream),
                      "KV-cache append launch failed");
}

// V's extra maps for the instances with per-sequence geometry (FwdParams::v_map16 / v_map1: the last tile's rows
// past a sequence's keys are loaded as zeros).
void map_value_tails(const Tensor& v, int64_t head_dim, FwdParams& params) {
  map_tensor(v, head_dim, 16, &params.v_map16);
  map_tensor(v, head_dim, 1, &params.v_map1);
}

// The page size as each kernel reads it: the decode kernel steps through its pages, the forward kernel's producer
// divides by it (perf-log F30).
void set_page_size(const KvCacheArgs& cache, DecodeParams& params) { params.page_size = int32_t(cache.page_size); }
void set_page_size(const KvCacheArgs& cache, FwdParams& params) {
  if (cache.page_table != nullptr) params.page_divmod = cuda::FastDivmod(uint32_t(cache.page_size));
}

// A KV-cache call's metadata into a kernel's parameters (FwdParams and DecodeParams name the fields alike).
template <class Params>
void set_cache_fields(const KvCacheArgs& cache, Params& params) {
  params.seqused_k = cache.cache_seqlens;
  params.seqlen_k_added = int32_t(cache.seqlen_new);
  params.page_table = cache.page_table;
  params.page_table_stride = int32_t(cache.max_pages);
  set_page_size(cache, params);
}

// Split-KV's partials (FwdPlan::splits > 1): in the caller's workspace, or in stream-ordered memory (`owned`, freed
// by the caller on every path).
struct SplitPartials {
  float* o = nullptr;
  float* lse = nullptr;
};
SplitPartials split_partials(const char* call, const detail::Problem& p, const FwdPlan& plan, Workspace workspace,
                             cudaStream_t stream, std::optional<StreamOrderedBuffer>& owned) {
  const SplitWorkspaceLayout layout = split_workspace_layout(p, plan.splits);
  uint8_t* base = static_cast<uint8_t*>(workspace.data);
  if (base == nullptr) {
    owned.emplace(call, layout.bytes, stream, "the split-KV partials");
    base = static_cast<uint8_t*>(owned->get());
  }
  if (reinterpret_cast<uintptr_t>(base) % 256 != 0)
    throw Error(Status::invalid_argument, std::string(call) + ": argument 'workspace': expected a 256-byte aligned "
                                                              "pointer, got address " +
                                              std::to_string(reinterpret_cast<uintptr_t>(base)));
  return {reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + layout.lse_offset)};
}

// The combine kernel's view of a split call: the unpacked rows (partial rows are laid out the same in both views).
SplitCombineParams combine_params(const detail::Problem& p, const FwdPlan& plan, const SplitPartials& partials,
                                  const Tensor& out, const Tensor* lse) {
  SplitCombineParams c;
  c.o_partial = partials.o;
  c.lse_partial = partials.lse;
  c.num_splits = plan.splits;
  c.batch = int32_t(p.batch), c.heads_q = int32_t(p.heads_q), c.seqlen_q = int32_t(p.seqlen_q);
  c.head_dim = int32_t(p.head_dim);
  c.out = out.data;
  c.out_stride_b = out.stride[kBatch], c.out_stride_s = out.stride[kSeq], c.out_stride_h = out.stride[kHeads];
  c.out_pairs_aligned = reinterpret_cast<uintptr_t>(out.data) % 4 == 0 && out.stride[kBatch] % 2 == 0 &&
                        out.stride[kSeq] % 2 == 0 && out.stride[kHeads] % 2 == 0;
  if (lse != nullptr) {
    c.lse = static_cast<float*>(lse->data);
    c.lse_stride_b = lse->stride[0], c.lse_stride_h = lse->stride[1], c.lse_stride_s = lse->stride[2];
  }
  if (p.sinks != nullptr) {
    c.sinks = static_cast<const float*>(p.sinks->data);
    c.sinks_stride = p.sinks->stride[0];
  }
  return c;
}

// Rows of a [batch, seqlen, heads, head_dim] tensor the decode kernel can copy in 16-byte pieces.
bool rows_16b(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.stride[kBatch] % 8 == 0 && t.stride[kSeq] % 8 == 0 &&
         t.stride[kHeads] % 8 == 0;
}
// Whether k and v step alike through batch, seqlen and heads (the decode kernel's one set of strides); with
// `used_dims_only`, the strides of dims of size 1 (never stepped) are left out.
bool same_strides(const Tensor& k, const Tensor& v, bool used_dims_only = false) {
  for (int dim : {kBatch, kSeq, kHeads})
    if (k.stride[dim] != v.stride[dim] && !(used_dims_only && k.shape[dim] == 1)) return false;
  return true;
}

// The decode kernel's calls (decode.hpp): one query per sequence, a group that fits its 16 rows, no left window
// (with one query, causal and a right window hide no key), no sink and no exp2 emulation (it has neither), and
// rows it can address: 16-byte K/V rows with one set of strides for both, 4-byte query pairs.
bool decode_kernel_applies(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v) {
  return decode_kernel_takes(p) && rows_16b(k) && rows_16b(v) && same_strides(k, v) &&
         reinterpret_cast<uintptr_t>(q.data) % 4 == 0 && q.stride[kBatch] % 2 == 0 && q.stride[kHeads] % 2 == 0;
}

// Whether the decode kernel appends a KV-cache call's new keys itself (DecodeParams::k_new; perf-log F33), one
// launch less than the append kernel before it: rows it can copy as it copies the cache's.
bool decode_kernel_appends(const FwdSwitches& switches, const KvCacheArgs& cache) {
  return kDecodeAppends && switches.decode_append && cache.k_new != nullptr && cache.seqlen_new > 0 &&
         rows_16b(*cache.k_new) && rows_16b(*cache.v_new) && same_strides(*cache.k_new, *cache.v_new, true);
}

// A call decode_kernel_applies to, on the decode kernel: the plan's split count (and so its workspace), a KV-cache
// call's append (in the kernel where decode_kernel_appends, else the append kernel first), the combine after a split.
void run_decode(const char* call, const FwdSwitches& switches, const detail::Problem& p, const FwdPlan& plan,
                const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
                const KvCacheArgs* cache, Workspace workspace, Stream stream) {
  const DeviceGuard device(call, q.device_index);
  const cudaStream_t cu_stream = reinterpret_cast<cudaStream_t>(stream);
  DecodeParams d;
  d.q = q.data, d.q_stride_b = q.stride[kBatch], d.q_stride_h = q.stride[kHeads];
  d.out = out.data, d.out_stride_b = out.stride[kBatch], d.out_stride_h = out.stride[kHeads];
  d.k = k.data, d.v = v.data;  // one set of strides (decode_kernel_applies)
  d.kv_stride_b = k.stride[kBatch], d.kv_stride_s = k.stride[kSeq], d.kv_stride_h = k.stride[kHeads];
  d.seqlen_k = int32_t(p.seqlen_k);
  if (cache != nullptr) set_cache_fields(*cache, d);
  const bool appends = cache != nullptr && decode_kernel_appends(switches, *cache);
  if (appends) {  // one set of strides (decode_kernel_appends)
    d.k_new = cache->k_new->data, d.v_new = cache->v_new->data;
    const auto& stride = cache->k_new->stride;
    d.new_stride_b = stride[kBatch], d.new_stride_s = stride[kSeq], d.new_stride_h = stride[kHeads];
  }
  d.batch = int32_t(p.batch), d.heads_kv = int32_t(p.heads_kv), d.group = int32_t(p.group());
  d.num_splits = plan.splits;
  d.score = num::ScoreTransform::make(p.scale, p.softcap);
  d.rescale_threshold = p.rescale_threshold;
  if (uint64_t(plan.splits) * uint64_t(p.heads_kv) * uint64_t(p.batch) > uint64_t(kMaxIndex))
    unsupported(call, "q", "at most 2^31 - 1 decode CTAs (splits·heads_kv·batch)",
                std::to_string(uint64_t(plan.splits) * uint64_t(p.heads_kv) * uint64_t(p.batch)));
  std::optional<StreamOrderedBuffer> owned;
  SplitPartials partials;
  if (plan.splits > 1) {
    partials = split_partials(call, p, plan, workspace, cu_stream, owned);
    d.o_partial = partials.o, d.lse_partial = partials.lse;
  } else if (lse != nullptr) {
    d.lse = static_cast<float*>(lse->data), d.lse_stride_b = lse->stride[0], d.lse_stride_h = lse->stride[1];
  }
  if (cache != nullptr && !appends) append_new_keys(call, k, v, *cache, cu_stream);
  throw_if_cuda_error(call, launch_decode(p.dtype, int(p.head_dim), d, cu_stream), "sm_90a decode launch failed");
  if (plan.splits > 1)
    throw_if_cuda_error(call, launch_split_combine(p.dtype, combine_params(p, plan, partials, out, lse), cu_stream),
                        "split-KV combine launch failed");
  if (owned) owned->free(call);
}

// The dense forward, or with `cache` a KV-cache call: the same plan (row, GQA packing, splits), run by the
// instances with per-sequence geometry over the cache (k, v: the caches; p sized on their capacity).
void run_forward(const char* call, const detail::Problem& p, const Tensor& q_in, const Tensor& k, const Tensor& v,
                 const Tensor& out_in, const Tensor* lse_in, const KvCacheArgs* cache, Workspace workspace,
                 Stream stream) {
  if (p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0) {  // no output element; a KV-cache call still appends
    if (cache != nullptr && p.batch > 0) {
      const DeviceGuard device(call, q_in.device_index);
      append_new_keys(call, k, v, *cache, reinterpret_cast<cudaStream_t>(stream));
    }
    return;
  }
  const FwdSwitches switches = read_fwd_switches(call);  // before anything is allocated (a bad value is refused)

  const FwdPlan plan = plan_forward(p);
  const int row = plan.row;
  if (row < 0 || row >= kFwdRows || kFwdTiles[row].head_dim != p.head_dim)
    throw Error(Status::invalid_argument, std::string(call) + ": tile-table row " + std::to_string(row) +
                                              " is not a row of head dim " + std::to_string(p.head_dim));
  // The decode kernel where its ranges are short (judged on p.seqlen_k: a KV cache's capacity, its sequences' keys
  // being on the device): it wins where a call's time is latency (H200, d = 128, 32/8: b = 1
  // 4k 15.0 -> 12.4 µs, 256 keys a range) and loses where it is bandwidth, as its issue rate caps it near 3.1-3.8
  // TB/s (b = 1 32k 43.0 -> 49.3 µs, b = 8 16k 133 -> 176, 2048-8192 keys a range; on the H100, 3.0 TB/s, it won
  // those by 5-12%: perf-log F27).
  // By default (FA4_FWD_DECODE_KERNEL=3, F36) only where the forward kernel's plan splits as well: at larger
  // batches the decode rule splits only to avoid a wave tail, which the forward kernel does not need (H100, 32/8
  // heads, s_k = 1k: b = 16 31.6 -> 27.4 µs, b = 64 100.0 -> 92.8; b = 64 s_k = 2k 191 -> 177).
  using DecodeKernel = FwdSwitches::DecodeKernel;
  const bool decode_chosen = plan.decode_splits > 0 &&
                             (p.seqlen_k + plan.decode_splits - 1) / plan.decode_splits <= kDecodeMaxRangeKeys &&
                             (switches.decode_kernel != DecodeKernel::short_ranges_where_split || plan.splits > 1);
  // A forced tile row (ScopedFwdRow: the tests' sweep of every row) is the forward kernel's.
  if (switches.decode_kernel != DecodeKernel::never && forced_fwd_row < 0 && decode_kernel_applies(p, q_in, k, v) &&
      (decode_chosen || switches.decode_kernel == DecodeKernel::always)) {
    FwdPlan decode = plan;
    decode.splits = plan.decode_splits;  // its ranges; the workspace holds either kernel's partials
    return run_decode(call, switches, p, decode, q_in, k, v, out_in, lse_in, cache, workspace, stream);
  }
  const FwdTile& tile = kFwdTiles[row];
  const uint32_t block_m = uint32_t(tile.block_m);
  const int64_t num_tiles = plan.num_tiles * plan.splits;
  if (num_tiles > kMaxIndex / 2)  // the dynamic scheduler hands out up to grid + num_tiles indices
    unsupported(call, "q", "at most 2^30 query tiles of " + std::to_string(block_m) + " rows (batch·heads·tiles·splits)",
                std::to_string(num_tiles));
  const bool split = plan.splits > 1;
  const Tensor q = plan.pack_gqa ? packed_rows(q_in, p.group()) : q_in;
  const Tensor out = plan.pack_gqa ? packed_rows(out_in, p.group()) : out_in;
  std::optional<Tensor> lse_packed;
  if (lse_in != nullptr && plan.pack_gqa) lse_packed = packed_lse(*lse_in, p.group());
  const Tensor* lse = lse_packed ? &*lse_packed : lse_in;

  // Everything below (tensor-map encoding included, which needs a current context) runs on the tensors'
  // device; cudaSetDevice also initialises its primary context. The caller's current device is restored.
  const DeviceGuard device(call, q.device_index);
  const cudaStream_t cu_stream = reinterpret_cast<cudaStream_t>(stream);

  FwdParams params;
  const CoordSteps q_steps = map_tensor(q, p.head_dim, block_m, &params.q_map);
  params.q_head_step = q_steps.head;
  params.q_batch_step = q_steps.batch;
  if (p.seqlen_k > 0) {  // no K/V element: the kernel loads nothing (and the data may be null)
    // A paged cache's boxes stay inside a page: the largest divisor of block_n that divides the page size too.
    const uint32_t box_rows = uint32_t(cache != nullptr && cache->page_table != nullptr
                                           ? std::gcd<int64_t>(tile.block_n, cache->page_size)
                                           : tile.block_n);
    const CoordSteps k_steps = map_tensor(k, p.head_dim, box_rows, &params.k_map);
    const CoordSteps v_steps = map_tensor(v, p.head_dim, box_rows, &params.v_map);
    params.k_head_step = k_steps.head;
    params.k_batch_step = k_steps.batch;
    params.v_head_step = v_steps.head;
    params.v_batch_step = v_steps.batch;
    if (cache != nullptr) map_value_tails(v, p.head_dim, params);
    params.kv_box_rows = int32_t(box_rows);
  }
  if (cache != nullptr) set_cache_fields(*cache, params);
  // TMA store when the output is addressable by TMA under the inputs' rule; else the epilogue's per-thread stores
  // (always for a KV-cache call: its instances store per thread). Split-KV writes fp32 partials instead (per
  // thread), and the combine kernel (or the forward's in-kernel merge) writes out and lse.
  if (!split && cache == nullptr && tma_addressable(out)) {
    map_tensor(out, p.head_dim, uint32_t(kWgmmaM), &params.out_map);
    params.out_tma = true;
  }
  params.out = out.data;
  params.out_stride_b = out.stride[kBatch];
  params.out_stride_s = out.stride[kSeq];
  params.out_stride_h = out.stride[kHeads];
  params.out_pairs_aligned = reinterpret_cast<uintptr_t>(out.data) % 4 == 0 && out.stride[kBatch] % 2 == 0 &&
                             out.stride[kSeq] % 2 == 0 && out.stride[kHeads] % 2 == 0;
  if (lse != nullptr && !split) {
    params.lse = static_cast<float*>(lse->data);
    params.lse_stride_b = lse->stride[0];
    params.lse_stride_h = lse->stride[1];
    params.lse_stride_s = lse->stride[2];
  }
  if (p.sinks != nullptr && !split) {  // with splits the sink joins in the combine, once
    params.sinks = static_cast<const float*>(p.sinks->data);
    params.sinks_stride = p.sinks->stride[0];
  }
  params.seqlen_q = int32_t(plan.seqlen_q);
  params.seqlen_k = int32_t(p.seqlen_k);
  params.group = int32_t(plan.group);
  params.order.num_m_blocks = int32_t(plan.num_m_blocks);
  params.order.heads_q = int32_t(plan.heads);
  params.order.batch = int32_t(p.batch);
  params.order.num_splits = plan.splits;
  // Causal-shaped work (a row sees more keys the later it is): longest-first through a counter. Windows, no mask
  // and split-KV: every tile costs about the same, a static stride over the persistent grid.
  // A KV-cache call's sequences differ in length, so the static order (each tile takes its own).
  params.order.lpt = p.mask.right >= 0 && p.mask.left < 0 && !plan.pack_gqa && !split && cache == nullptr;
  params.order.lpt_section = lpt_section(p, p.seqlen_k, plan.heads * p.batch, q.device_index);
  // The packed view's rows are query heads of one query position: no mask applies to them (see FwdPlan).
  params.mask = plan.pack_gqa ? num::Mask::make(plan.seqlen_q, p.seqlen_k, false, -1, -1) : p.mask;
  // FA4_AB_TOP_PAD (perf-log F53): a dense call of one key range whose keys end with the row pads its first query
  // tile at the top, so its padding rows ride along with the tile that sees the fewest keys, not the most. The
  // kernel numbers rows from m_shift rows above q's row 0: seqlen_q and the mask are those rows' (the same
  // visibility: the mask's offset seqlen_k − seqlen_q drops by the shift as every row index grows by it).
  if (kTopPad && p.mask.right >= 0 && !split && cache == nullptr && !plan.pack_gqa &&
      plan.seqlen_q <= INT32_MAX - int64_t(block_m)) {
    params.m_shift = int32_t((block_m - plan.seqlen_q % block_m) % block_m);
    params.seqlen_q += params.m_shift;
    params.mask.seqlen_q += params.m_shift;
  }
  params.score = num::ScoreTransform::make(p.scale, p.softcap);
  params.rescale_threshold = p.rescale_threshold;
  params.exp2_emulated_per16 = p.exp2_emulated_per16;

  // Split partials: the caller's workspace, or stream-ordered memory (freed on every path); the combine's view is
  // the unpacked one.
  std::optional<StreamOrderedBuffer> owned;
  if (split) {
    const SplitPartials partials = split_partials(call, p, plan, workspace, cu_stream, owned);
    params.o_partial = partials.o;
    params.lse_partial = partials.lse;
    params.combine = combine_params(p, plan, partials, out_in, lse_in);
  }
  // The persistent grid: one CTA per SM (the shared-memory tile allows no second), none idle on small problems.
  const int64_t sms = device_attribute(q.device_index, cudaDevAttrMultiProcessorCount).value_or(1);
  const uint32_t grid = uint32_t(std::min<int64_t>(num_tiles, std::max<int64_t>(sms, 1)));
  params.cluster_combine =
      merges_in_cluster(call, switches, p, row, /*varlen=*/cache != nullptr, plan.splits, num_tiles, sms);
  std::optional<StreamOrderedBuffer> counter;
  apply_switches_and_zero_tile_counter(call, switches, params, cu_stream, counter);
#if FA4_TRACE
  params.trace = trace::begin_launch(
      "sm90 fwd " + std::string(to_string(p.dtype)) + " d" + std::to_string(p.head_dim) + " tile " +
          std::to_string(tile.block_m) + "x" + std::to_string(tile.block_n) + " (row " + std::to_string(row) + ")" +
          (split ? " splits " + std::to_string(plan.splits) : "") + (params.cluster_combine ? " cluster-combine" : "") +
          (plan.pack_gqa ? " gqa-packed" : ""),
      grid, fwd_trace_writer_names(tile.block_m / kWgmmaM), cu_stream);
#endif
  // A KV-cache call's append, last before the kernel: every check above (workspace, tile count, tensor maps,
  // allocations) has passed, so a refused call has written nothing into the caches. The forward's
  // cudaGridDependencySynchronize waits for it.
  if (cache != nullptr) append_new_keys(call, k, v, *cache, cu_stream);
  throw_if_cuda_error(call,
                      launch_fwd_kernel(p.dtype, int(p.head_dim), row, /*varlen=*/cache != nullptr, params, grid,
                                        params.cluster_combine ? uint32_t(plan.splits) : 1u, cu_stream),
                      "sm_90a forward launch failed");
  if (counter) counter->free(call);
  if (split && !params.cluster_combine)
    throw_if_cuda_error(call, launch_split_combine(p.dtype, params.combine, cu_stream), "split-KV combine launch failed");
  if (owned) owned->free(call);
}

}  // namespace

void forward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
             const Tensor* lse, Workspace workspace, Stream stream) {
  run_forward("fa4::forward", p, q, k, v, out, lse, nullptr, workspace, stream);
}

void forward_kvcache(const detail::Problem& p, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& out, const Tensor* lse, const KvCacheArgs& cache, Workspace workspace,
                     Stream stream) {
  run_forward("fa4::forward_kvcache", p, q, k_cache, v_cache, out, lse, &cache, workspace, stream);
}

void forward_varlen(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out3,
                    const Tensor* lse2, const Varlen& vl, Stream stream) {
  const char* call = "fa4::forward_varlen";
  if (vl.batch == 0 || vl.max_seqlen_q == 0 || p.heads_q == 0) return;  // no row of any sequence
  const FwdSwitches switches = read_fwd_switches(call);  // before anything is allocated (a bad value is refused)
  const int row = fwd_varlen_row(int(p.head_dim));
  if (row < 0) throw Error(Status::internal, std::string(call) + ": no varlen row for head dim " + std::to_string(p.head_dim));
  const FwdTile& tile = kFwdTiles[row];
  const int64_t num_m_blocks = (vl.max_seqlen_q + tile.block_m - 1) / tile.block_m;
  const int64_t num_tiles = num_m_blocks * p.heads_q * vl.batch;
  if (num_tiles > kMaxIndex / 2 || vl.batch > kMaxIndex)
    unsupported(call, "varlen.batch", "at most 2^30 query tiles of " + std::to_string(tile.block_m) +
                                          " rows (batch·heads·ceil(max_seqlen_q / block_m))",
                std::to_string(num_tiles));
  const DeviceGuard device(call, q.device_index);
  const cudaStream_t cu_stream = reinterpret_cast<cudaStream_t>(stream);

  FwdParams params;
  const CoordSteps q_steps = map_tensor(q, p.head_dim, uint32_t(tile.block_m), &params.q_map);
  params.q_head_step = q_steps.head;
  params.q_batch_step = 0;  // one packed batch: rows are offset by the sequence's start instead
  if (k.shape[kSeq] > 0) {  // no key at all: nothing is loaded (and the maps are never encoded)
    const CoordSteps k_steps = map_tensor(k, p.head_dim, uint32_t(tile.block_n), &params.k_map);
    const CoordSteps v_steps = map_tensor(v, p.head_dim, uint32_t(tile.block_n), &params.v_map);
    params.k_head_step = k_steps.head, params.v_head_step = v_steps.head;
    params.k_batch_step = 0, params.v_batch_step = 0;
    map_value_tails(v, p.head_dim, params);
    params.kv_box_rows = tile.block_n;
  }
  // Per-thread stores bounded by each sequence's length (a TMA box would write into the next sequence's rows).
  params.out_tma = false;
  params.out = out3.data;
  params.out_stride_b = 0;
  params.out_stride_s = out3.stride[0];
  params.out_stride_h = out3.stride[1];
  params.out_pairs_aligned = reinterpret_cast<uintptr_t>(out3.data) % 4 == 0 && out3.stride[0] % 2 == 0 &&
                             out3.stride[1] % 2 == 0;
  if (lse2 != nullptr) {  // [heads, total_q]
    params.lse = static_cast<float*>(lse2->data);
    params.lse_stride_b = 0;
    params.lse_stride_h = lse2->stride[0];
    params.lse_stride_s = lse2->stride[1];
  }
  if (p.sinks != nullptr) {
    params.sinks = static_cast<const float*>(p.sinks->data);
    params.sinks_stride = p.sinks->stride[0];
  }
  params.seqlen_q = int32_t(vl.max_seqlen_q);
  params.seqlen_k = int32_t(vl.max_seqlen_k);
  params.group = int32_t(p.group());
  params.order.num_m_blocks = int32_t(num_m_blocks);
  params.order.heads_q = int32_t(p.heads_q);
  params.order.batch = int32_t(vl.batch);
  params.order.num_splits = 1;
  // The static order handed out by the tile counter (perf-log F24: +6-13% over the fixed stride that
  // FA4_FWD_VARLEN_COUNTER=0 keeps); every tile takes its own sequence's sizes (a tile past them does nothing).
  // A/B candidate FA4_AB_VARLEN_LPT (off by default, not yet measured): causal-shaped masks walk the
  // longest-first order (query blocks last first over every sequence, the dense causal order) instead.
  params.order.lpt = FA4_AB_VARLEN_LPT && p.mask.right >= 0 && p.mask.left < 0;
  params.order.lpt_section = lpt_section(p, vl.max_seqlen_k, p.heads_q * vl.batch, q.device_index);
  params.mask = p.mask;      // built on the longest sizes; each tile puts its sequence's sizes in (scheduler.cuh)
  params.score = num::ScoreTransform::make(p.scale, p.softcap);
  params.rescale_threshold = p.rescale_threshold;
  params.exp2_emulated_per16 = p.exp2_emulated_per16;
  params.cu_seqlens_q = vl.cu_seqlens_q;
  params.cu_seqlens_k = vl.cu_seqlens_k;
  params.seqused_k = vl.seqused_k;

  const int64_t sms = device_attribute(q.device_index, cudaDevAttrMultiProcessorCount).value_or(1);
  const uint32_t grid = uint32_t(std::min<int64_t>(num_tiles, std::max<int64_t>(sms, 1)));
  std::optional<StreamOrderedBuffer> counter;
  apply_switches_and_zero_tile_counter(call, switches, params, cu_stream, counter,
                                       /*counted=*/switches.varlen_counter && num_tiles > int64_t(grid));
#if FA4_TRACE
  params.trace = trace::begin_launch("sm90 fwd varlen " + std::string(to_string(p.dtype)) + " d" +
                                         std::to_string(p.head_dim) + " (row " + std::to_string(row) + ")",
                                     grid, fwd_trace_writer_names(tile.block_m / kWgmmaM), cu_stream);
#endif
  throw_if_cuda_error(call, launch_fwd_kernel(p.dtype, int(p.head_dim), row, /*varlen=*/true, params, grid, 1, cu_stream),
                      "sm_90a varlen forward launch failed");
  if (counter) counter->free(call);
}

}  // namespace fa4::sm90
