// Host side of the sm_90a backward: workspace, tensor maps and parameters, then three launches on the caller's
// stream (preprocess, main kernel, postprocess). Nothing is allocated unless the caller gave no workspace.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "cuda/sm90/bwd/config.hpp"
#include "cuda/sm90/bwd/kernel.hpp"
#include "cuda/sm90/bwd/walk_order.hpp"
#include "cuda/sm90/launch.hpp"
#include "cuda/sm90/launch_common.hpp"
#if FA4_TRACE
#include "cuda/sm90/trace_writers.hpp"
#include "cuda/trace/launch_sink.hpp"
#endif

namespace fa4::sm90 {
namespace {

StridedRows strided_rows(const Tensor& t) {
  StridedRows r;
  r.data = t.data;
  r.stride_b = t.stride[kBatch];
  r.stride_s = t.stride[kSeq];
  r.stride_h = t.stride[kHeads];
  r.pairs_aligned = reinterpret_cast<uintptr_t>(t.data) % 4 == 0 && r.stride_b % 2 == 0 && r.stride_s % 2 == 0 &&
                    r.stride_h % 2 == 0;
  r.chunks_aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && r.stride_b % 8 == 0 && r.stride_s % 8 == 0 &&
                     r.stride_h % 8 == 0;
  return r;
}

// Whether the main kernel runs as CTA pairs (clusters of two on neighbouring key blocks, docs/sm90-backward.md),
// and whether the pair sums its dQ slabs through DSMEM: key-split rows outside deterministic mode (whose turns
// count single key blocks). FA4_BWD_CLUSTER overrides the default for A/B runs: 0 (single CTAs), 1 (the pair
// with the dQ exchange), multicast (the pair sharing Q/dO only; each CTA adds its own dQ slabs); any other value
// is an error, not a silent default.
struct PairMode {
  bool pair = false, dq_exchange = false;
};
PairMode pair_mode(const char* call, const BwdTile& tile, const detail::Problem& p) {
  // Off: on the H200 the pair ran at 0.63-0.70x of the single-CTA kernel (perf-log B8), so it stays an option.
  constexpr PairMode kDefault{};
  const char* env = std::getenv("FA4_BWD_CLUSTER");
  PairMode asked = kDefault;
  if (env != nullptr && *env != '\0') {  // a bad value is refused whatever the call (not only where it applies)
    const std::string value(env);
    if (value == "1")
      asked = {true, true};
    else if (value == "multicast")
      asked = {true, false};
    else if (value != "0")
      throw Error(Status::invalid_argument, std::string(call) +
                                                ": environment FA4_BWD_CLUSTER: expected 0, 1 or multicast, got '" +
                                                value + "'");
  }
  if (!bwd_pair_capable(tile) || p.deterministic) return {};
  return asked;
}

// Deterministic mode's turn chains (dq_turn_of): key block n adds into accumulator copy n % chains in the chain's
// own turn order, so the CTAs of a wave wait for 1/chains of the links before their first add, at the cost of
// summing chains - 1 more fp32 dQ copies. The default is the tile row's (kBwdTiles, perf-log B17), one count
// without a mask and one with (causal or a window), at most kShortKeysDetChains up to kShortKeysMax keys (B26: a
// copy costs the same whatever the key count, the work grows with it, so short keys want fewer copies);
// FA4_BWD_DET_CHAINS (1 to kBwdMaxDetChains: dq_turn_of takes any count) overrides it for A/B runs, any other value
// is an error. Outside deterministic mode: 1 (a set value is still checked).
int det_chains(const char* call, const detail::Problem& p) {
  const int row = bwd_row(int(p.head_dim));
  int chains = row < 0 ? 1 : p.mask.masks_anything() ? kBwdTiles[row].det_chains_masked : kBwdTiles[row].det_chains;
  if (p.seqlen_k <= kShortKeysMax) chains = std::min(chains, kShortKeysDetChains);
  const char* env = std::getenv("FA4_BWD_DET_CHAINS");
  if (env != nullptr && *env != '\0') {
    const std::string value(env);
    static_assert(kBwdMaxDetChains == 4, "the message below names the counts");
    if (value.size() != 1 || value[0] < '1' || value[0] > '4')
      throw Error(Status::invalid_argument,
                  std::string(call) + ": environment FA4_BWD_DET_CHAINS: expected 1, 2, 3 or 4, got '" + value + "'");
    chains = std::stoi(value);
  }
  return p.deterministic ? chains : 1;
}

// The environment overrides of one call, read once: a value the call cannot take is refused by name.
//   FA4_BWD_DET_HELPER (default 1): deterministic column-split rows pass their dQ turns in helper warps
//     (dq_reduce.cuh; perf-log B13, H100: deterministic d = 256 +28% at 2k, +50% at 8k); 0: the warpgroups pass
//     them themselves (A/B runs and the test that compares the two).
//   FA4_BWD_DET_SLAB_RELEASE (default 1): deterministic key-split rows' dQ writer passes each slab's turn on as
//     soon as its own add is performed (perf-log B14: +0.6-2% on top of two chains); 0: after the tile's last.
//   FA4_BWD_DET_STORE_FIRST (default 1): the first adder of each chain stores its dQ slab instead of adding it, so
//     the preprocess zeroes no accumulator copy (perf-log B15: deterministic d = 64 2k 0.80 -> 0.86 of the
//     default, d = 128 0.84 -> 0.88, d = 256 level); 0: every copy zeroed and every slab added.
//   FA4_BWD_DQ_REGISTER_ADDS (default: the row's BwdTile::dq_register_adds, on at d = 128; perf-log B20): 1: key-split
//     rows in the default mode without the CTA pair add each warpgroup's dQ slab from its registers
//     (red.global.add.v4.f32) instead of staging it for the dQ writer's bulk reduce-add; 0: staged. Deterministic
//     mode and the pair keep the writer.
//   FA4_BWD_DET_TWO_BUFFERS (default 1): deterministic key-split rows with two staging buffers per warpgroup in
//     their tile (BwdTile::det_staging_buffers: d = 128; d = 64 too in B27's build) stage in both, one per dQ
//     writer, without the CTA pair (perf-log B23); 0: one buffer, as the other rows.
//   FA4_BWD_DET_REGISTER_ADDS (default: the row's BwdTile::det_register_adds_unmasked when nothing is masked, so on
//     at d = 128 without causal or a window; perf-log B24): deterministic key-split rows without the CTA pair add
//     each warpgroup's dQ slab from its registers in its turn (the column-split rows' turn helpers, always on
//     there: FA4_BWD_DET_HELPER applies to the column-split rows), instead of staging it for the writers.
//   FA4_BWD_DET_ROTATED (default 1; perf-log B29, H200: deterministic / default 0.83-0.94 -> 0.91-1.02 at d = 64-256,
//     1k-2k): deterministic calls without a mask take the rotated walk (walk_order.hpp) on a persistent cooperative
//     grid, where it applies (rotated_walk_applies), with one chain; 0: the chains everywhere.
//   FA4_BWD_PDL (default 0; perf-log B16: level, within one rep's spread, at d = 64-256, 2k and 8k): the main
//     kernel and the postprocess as programmatic dependent launches of the kernel before each (their launch and
//     set-up overlap its tail).
struct Overrides {
  PairMode pair;
  bool turn_helpers = true;
  int chains = 1;
  bool slab_release = true;
  bool store_first = true;
  bool two_buffers = true;
  bool det_register_adds = false;
  bool pdl = false;
  bool dq_register_adds = false;
  bool rotated = false;
};
Overrides read_overrides(const char* call, const BwdTile& tile, const detail::Problem& p, bool varlen) {
  const bool det_register_adds = tile.det_register_adds_unmasked && !p.mask.masks_anything();
  Overrides o{pair_mode(call, tile, p), env_switch(call, "FA4_BWD_DET_HELPER", true), det_chains(call, p),
              env_switch(call, "FA4_BWD_DET_SLAB_RELEASE", true), env_switch(call, "FA4_BWD_DET_STORE_FIRST", true),
              env_switch(call, "FA4_BWD_DET_TWO_BUFFERS", true),
              env_switch(call, "FA4_BWD_DET_REGISTER_ADDS", det_register_adds),
              env_switch(call, "FA4_BWD_PDL", false), env_switch(call, "FA4_BWD_DQ_REGISTER_ADDS", tile.dq_register_adds),
              env_switch(call, "FA4_BWD_DET_ROTATED", true)};
  if (varlen && o.pair.pair)
    throw Error(Status::unsupported, std::string(call) + ": environment FA4_BWD_CLUSTER: expected 0 or unset for a "
                                                         "variable-length batch (the CTA pair runs dense batches "
                                                         "only), got '" + std::getenv("FA4_BWD_CLUSTER") + "'");
  return o;
}

// Where the rotated walk can run: deterministic, nothing masked, a dense batch (every key block of a (batch, kv
// head) visits every query tile), at most one key block per position of the walk (distinct starts), and the
// (batch, kv head)'s key blocks resident at once (at most one per SM; sms < 0: not checked, for host-only tests),
// and n · P small enough for the walk's 32-bit turn arithmetic.
bool rotated_walk_applies(const BwdTile& tile, const detail::Problem& p, bool varlen, int64_t sms) {
  if (!p.deterministic || varlen || p.mask.masks_anything() || p.seqlen_q == 0 || p.seqlen_k == 0) return false;
  const int64_t n_blocks = (p.seqlen_k + tile.block_n - 1) / tile.block_n;
  const int64_t positions = p.group() * ((p.seqlen_q + tile.block_m - 1) / tile.block_m);
  return n_blocks <= positions && n_blocks * positions < RotatedWalk::kMaxProduct && (sms < 0 || n_blocks <= sms);
}

// The main kernel's paths from the overrides, the row and the problem (the one place they are derived).
BackwardPaths paths_of(const Overrides& o, const BwdTile& tile, const detail::Problem& p, bool varlen, int64_t sms) {
  BackwardPaths b;
  // (The pair never runs deterministic, pair_mode refuses it; the conditions on it say what each path needs.)
  b.cluster_pair = o.pair.pair;
  b.dq_register_adds = o.dq_register_adds && !tile.column_split && !p.deterministic && !o.pair.pair;
  b.det_register_adds = o.det_register_adds && !tile.column_split && p.deterministic && !o.pair.pair;
  b.det_turn_helpers = o.turn_helpers && tile.column_split && p.deterministic;
  b.det_slab_release = o.slab_release && !tile.column_split && p.deterministic && !b.det_register_adds;  // writers'
  b.det_store_first = p.deterministic && o.store_first;
  b.det_two_buffers =
      o.two_buffers && tile.det_staging_buffers == 2 && p.deterministic && !o.pair.pair && !b.det_register_adds;
  b.det_rotated_walk = o.rotated && !o.pair.pair && rotated_walk_applies(tile, p, varlen, sms);
  b.det_chains = b.det_rotated_walk ? 1 : o.chains;
  return b;
}

BwdWorkspaceLayout layout_of(const detail::Problem& p, int chains) {
  return bwd_workspace_layout(bwd_row(int(p.head_dim)), p.batch, p.heads_q, p.seqlen_q, chains,
                              p.varlen ? p.varlen_total_q : -1);
}

// The sinks and their gradient, when the call has them.
void set_sinks(const detail::Problem& p, BwdPrePostParams& pp) {
  if (p.sinks == nullptr || p.dsinks == nullptr) return;  // the main kernel needs no sink: LSE already has it
  pp.sinks = static_cast<const float*>(p.sinks->data);
  pp.sinks_stride = p.sinks->stride[0];
  pp.dsinks = static_cast<float*>(p.dsinks->data);
  pp.dsinks_stride = p.dsinks->stride[0];
}

// The device's SM count (the rotated walk's residency test), 0 where it cannot be read (then it never applies).
int64_t device_sms(int index) { return device_attribute(index, cudaDevAttrMultiProcessorCount).value_or(0); }

}  // namespace

// The chains the launch will take (paths_of, the same SM count): the rotated walk's one where it applies, so its
// callers do not allocate copies it never writes (3 × 134 MB at d = 256, 16k tokens × 2048 hidden).
size_t backward_workspace_bytes(const detail::Problem& p) {
  const char* call = "fa4::workspace_size";
  const int row = bwd_row(int(p.head_dim));
  if (row < 0) return layout_of(p, det_chains(call, p)).bytes;
  const BwdTile& tile = kBwdTiles[row];
  return layout_of(p, paths_of(read_overrides(call, tile, p, p.varlen), tile, p, p.varlen, device_sms(p.device_index))
                          .det_chains)
      .bytes;
}

void check_backward_overrides(const char* call, const detail::Problem& p, bool varlen) {
  const int row = bwd_row(int(p.head_dim));
  if (row >= 0) read_overrides(call, kBwdTiles[row], p, varlen);
}

BackwardPaths backward_paths(const detail::Problem& p, bool varlen, int64_t sms) {
  const char* call = "fa4::sm90::backward_paths";
  const int row = bwd_row(int(p.head_dim));
  if (row < 0)
    throw Error(Status::unsupported, std::string(call) + ": no backward tile row for head dim " + std::to_string(p.head_dim));
  return paths_of(read_overrides(call, kBwdTiles[row], p, varlen), kBwdTiles[row], p, varlen, sms);
}

namespace {

// The backward of a dense batch (vl null) or of a variable-length one: then p is the problem of vl's sequence
// count and longest sequences, the tensors are the packed rows as batch 1 ([1, total, heads, d]), lse the packed
// [heads, total_q], and the metadata device arrays (trusted).
void run_backward(const char* call, const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                  const Tensor& dv, const Varlen* vl, Workspace workspace, Stream stream) {
  const int row = bwd_row(int(p.head_dim));
  if (row < 0)
    throw Error(Status::internal, std::string(call) + ": no backward tile row for head dim " + std::to_string(p.head_dim));
  const BwdTile& tile = kBwdTiles[row];
  // Before any work: a bad override leaves nothing behind.
  const Overrides overrides = read_overrides(call, tile, p, vl != nullptr);
  const PairMode pair = overrides.pair;
  const cudaStream_t cu_stream = reinterpret_cast<cudaStream_t>(stream);
  // A variable-length batch's rows that no sequence covers (and keys past seqused_k) get zero gradients, as on
  // the CPU backend: launched once every check has passed (a refused call writes nothing).
  auto zero_uncovered_rows = [&] {
    if (vl == nullptr || p.heads_q == 0) return;
    const DeviceGuard device(call, q.device_index);
    const StridedRows dk_rows = strided_rows(dk), dv_rows = strided_rows(dv);
    throw_if_cuda_error(call,
                        launch_bwd_zero_uncovered(strided_rows(dq), nullptr, q.shape[kSeq], int32_t(p.heads_q),
                                                  int32_t(p.head_dim), vl->cu_seqlens_q, nullptr, int32_t(vl->batch),
                                                  cu_stream),
                        "backward varlen zero-rows launch");
    throw_if_cuda_error(call,
                        launch_bwd_zero_uncovered(dk_rows, &dv_rows, k.shape[kSeq], int32_t(p.heads_kv),
                                                  int32_t(p.head_dim), vl->cu_seqlens_k, vl->seqused_k,
                                                  int32_t(vl->batch), cu_stream),
                        "backward varlen zero-rows launch");
  };
  if (p.batch == 0 || p.heads_q == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) {  // no dQ, dK or dV element
    zero_uncovered_rows();
    if (p.dsinks != nullptr && p.heads_q > 0) {  // no row either: dsinks = 0
      const DeviceGuard device(call, q.device_index);
      BwdPrePostParams none;
      none.heads_q = int32_t(p.heads_q);
      set_sinks(p, none);
      throw_if_cuda_error(call, launch_bwd_sink_gradient(none, 0, cu_stream), "backward sink-gradient launch");
    }
    return;
  }
  // The layout of the paths' chains: the caller's workspace was checked against the same layout's size
  // (detail::check_workspace, from backward_workspace_bytes, whose paths are these).
  const BackwardPaths paths = paths_of(overrides, tile, p, vl != nullptr, device_sms(q.device_index));
  const BwdWorkspaceLayout layout = layout_of(p, paths.det_chains);
  const int64_t n_blocks = (p.seqlen_k + tile.block_n - 1) / tile.block_n;
  constexpr int64_t kMaxIndex = (int64_t{1} << 31) - 1;
  if ((n_blocks + 1) * p.heads_kv * p.batch > kMaxIndex || p.batch * p.heads_q * (layout.rows_padded / kDqUnitRows) > kMaxIndex ||
      layout.rows_padded > kMaxIndex)
    throw Error(Status::unsupported, std::string(call) + ": argument 'q': expected fewer than 2^31 key blocks and "
                                                         "query row chunks (batch·heads·blocks), got shape [" +
                                         std::to_string(p.batch) + ", " + std::to_string(p.seqlen_q) + ", " +
                                         std::to_string(p.heads_q) + ", ...]");

  const DeviceGuard device(call, q.device_index);
  // The workspace: the caller's, or stream-ordered memory (freed on every path).
  std::optional<StreamOrderedBuffer> owned;
  uint8_t* base = static_cast<uint8_t*>(workspace.data);
  if (base == nullptr) {
    owned.emplace(call, layout.bytes, cu_stream, "the backward workspace");
    base = static_cast<uint8_t*>(owned->get());
  }
  if (reinterpret_cast<uintptr_t>(base) % 256 != 0)
    throw Error(Status::invalid_argument, std::string(call) + ": argument 'workspace': expected a 256-byte aligned "
                                                              "pointer, got address " +
                                              std::to_string(reinterpret_cast<uintptr_t>(base)));
  BwdWorkspace ws;
  ws.dq_accum = reinterpret_cast<float*>(base + layout.dq_accum);
  ws.lse_log2 = reinterpret_cast<float*>(base + layout.lse_log2);
  ws.dsum = reinterpret_cast<float*>(base + layout.dsum);
  ws.dq_turn = reinterpret_cast<int32_t*>(base + layout.dq_turn);
  ws.rows_padded = int32_t(layout.rows_padded);
  ws.rows_total = layout.rows_total;
  ws.chains = layout.chains;
  ws.dq_accum_copy_floats = int64_t(layout.dq_accum_copy_floats);
  ws.dq_turn_copy_counters = int64_t(layout.dq_turn_copy_counters);
  zero_uncovered_rows();

  BwdPrePostParams pp;
  pp.out = strided_rows(out);
  pp.dout = strided_rows(dout);
  pp.dq = strided_rows(dq);
  pp.lse = static_cast<const float*>(lse.data);
  if (vl != nullptr) {  // [heads, total_q]
    pp.lse_stride_h = lse.stride[0];
    pp.lse_stride_s = lse.stride[1];
    pp.cu_seqlens_q = vl->cu_seqlens_q;
  } else {
    pp.lse_stride_b = lse.stride[0];
    pp.lse_stride_h = lse.stride[1];
    pp.lse_stride_s = lse.stride[2];
  }
  pp.ws = ws;
  pp.seqlen_q = int32_t(p.seqlen_q);
  pp.heads_q = int32_t(p.heads_q);
  pp.head_dim = int32_t(p.head_dim);
  pp.block_m = tile.block_m;
  pp.turns_per_tile = bwd_consumer_warpgroups(tile);
  pp.deterministic = p.deterministic;
  pp.det_store_first = paths.det_store_first;  // the pre/postprocess's and the main kernel's
  pp.programmatic = overrides.pdl;
  pp.scale = p.scale;
  set_sinks(p, pp);
  if (p.seqlen_q > 0)
    throw_if_cuda_error(call, launch_bwd_preprocess(p.dtype, pp, p.batch, cu_stream), "backward preprocess launch");
  if (p.dsinks != nullptr)  // reads the preprocess's LSE₂ and D (with seqlen_q = 0: no row, zeros)
    throw_if_cuda_error(call, launch_bwd_sink_gradient(pp, p.batch, cu_stream), "backward sink-gradient launch");

  if (p.seqlen_k > 0) {
    BwdParams params;
    params.cluster_pair = paths.cluster_pair;
    params.pair_dq_exchange = pair.dq_exchange;
    params.det_register_adds = paths.det_register_adds;
    params.det_turn_helpers = paths.det_turn_helpers;
    params.det_slab_release = paths.det_slab_release;
    params.det_store_first = paths.det_store_first;
    params.det_two_buffers = paths.det_two_buffers;
    params.dq_register_adds = paths.dq_register_adds;
    params.programmatic = overrides.pdl;
    if (p.seqlen_q > 0) {  // else no query tile is ever loaded (and q may hold no memory)
      // A pair's CTAs load half a tile each: a box of half the rows when the tile is one head-dim chunk.
      const uint32_t box_rows = uint32_t(params.cluster_pair ? bwd_pair_box_rows(tile) : tile.block_m);
      const CoordSteps qs = map_tensor(q, p.head_dim, box_rows, &params.q_map);
      const CoordSteps ds = map_tensor(dout, p.head_dim, box_rows, &params.dout_map);
      params.q_head_step = qs.head, params.q_batch_step = qs.batch;
      params.dout_head_step = ds.head, params.dout_batch_step = ds.batch;
      if (vl != nullptr) {  // a sequence's last tile: its rows in 16-row and 1-row boxes (bwd/params.hpp)
        map_tensor(q, p.head_dim, 16, &params.q_map16), map_tensor(q, p.head_dim, 1, &params.q_map1);
        map_tensor(dout, p.head_dim, 16, &params.dout_map16), map_tensor(dout, p.head_dim, 1, &params.dout_map1);
      }
    }
    const CoordSteps ks = map_tensor(k, p.head_dim, uint32_t(tile.block_n), &params.k_map);
    const CoordSteps vs = map_tensor(v, p.head_dim, uint32_t(tile.block_n), &params.v_map);
    params.k_head_step = ks.head, params.k_batch_step = ks.batch;
    params.v_head_step = vs.head, params.v_batch_step = vs.batch;
    if (vl != nullptr) {
      map_tensor(k, p.head_dim, 16, &params.k_map16), map_tensor(k, p.head_dim, 1, &params.k_map1);
      map_tensor(v, p.head_dim, 16, &params.v_map16), map_tensor(v, p.head_dim, 1, &params.v_map1);
      params.cu_seqlens_q = vl->cu_seqlens_q;
      params.cu_seqlens_k = vl->cu_seqlens_k;
      params.seqused_k = vl->seqused_k;
    }
    params.ws = ws;
    params.dk = strided_rows(dk);
    params.dv = strided_rows(dv);
    // dK/dV by TMA store through the K/V tiles (free by then) when both are TMA-addressable; else per thread
    // (always for a variable-length batch: a box would write past its sequence).
    if (vl == nullptr && tma_addressable(dk) && tma_addressable(dv)) {
      map_tensor(dk, p.head_dim, uint32_t(kWgmmaM), &params.dk_map);
      map_tensor(dv, p.head_dim, uint32_t(kWgmmaM), &params.dv_map);
      params.dkv_tma = true;
    }
    params.seqlen_q = int32_t(p.seqlen_q);
    params.seqlen_k = int32_t(p.seqlen_k);
    params.heads_q = int32_t(p.heads_q);
    params.heads_kv = int32_t(p.heads_kv);
    params.group = int32_t(p.group());
    params.n_blocks = int32_t(n_blocks);
    params.n_block_slots = int32_t(params.cluster_pair ? (n_blocks + 1) / 2 * 2 : n_blocks);
    const uint32_t grid = uint32_t(int64_t(params.n_block_slots) * p.heads_kv * p.batch);
    params.work_items = int32_t(grid);
    params.m_tiles = int32_t(layout.rows_padded / tile.block_m);
    params.rotated_walk = paths.det_rotated_walk;
    params.mask = p.mask;
    params.score = num::ScoreTransform::make(p.scale, p.softcap);
    params.scale = p.scale;
    params.deterministic = p.deterministic;
#if FA4_TRACE
    params.trace = trace::begin_launch("sm90 bwd " + std::string(to_string(p.dtype)) + " d" +
                                           std::to_string(p.head_dim) + " tile " + std::to_string(tile.block_m) +
                                           "x" + std::to_string(tile.block_n) + (vl ? " varlen" : "") +
                                           (p.deterministic ? " deterministic" : "") +
                                           (pair.pair ? (pair.dq_exchange ? " pair" : " pair multicast-only") : "") +
                                           (paths.det_rotated_walk ? " rotated" : ""),
                                       grid,
                                       bwd_trace_writer_names(bwd_consumer_warpgroups(tile)), cu_stream);
#endif
    throw_if_cuda_error(call,
                        launch_bwd_kernel(p.dtype, int(p.head_dim), params, vl != nullptr, cu_stream),
                        "sm_90a backward launch failed");
  }
  if (p.seqlen_q > 0)
    throw_if_cuda_error(call, launch_bwd_postprocess(p.dtype, pp, p.batch, cu_stream), "backward postprocess launch");
  if (owned) owned->free(call);
}

}  // namespace

void backward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
              Workspace workspace, Stream stream) {
  run_backward("fa4::backward", p, q, k, v, out, dout, lse, dq, dk, dv, nullptr, workspace, stream);
}

void backward_varlen(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     const Varlen& varlen, Workspace workspace, Stream stream) {
  run_backward("fa4::backward_varlen", p, q, k, v, out, dout, lse, dq, dk, dv, &varlen, workspace, stream);
}

}  // namespace fa4::sm90
