// Split-KV and GQA packing in the sm_90a forward (Options::num_splits; launch.cu's FwdPlan), through the public
// API on cuda tensors, against the fp64 reference with the tolerance rule: forced split counts 1 .. beyond the
// key tiles, the fill rule (num_splits = 0) on decode shapes, packed decode (one query, the group's heads as a
// tile's rows) with and without masks, sinks joining in the combine, a caller's NaN-poisoned workspace and a
// too-small one, stride-0 query heads (not packed), bitwise repeatability, and the merge inside the forward's
// cluster (FA4_FWD_CLUSTER_COMBINE) against the combine kernel's bits. Outputs start NaN-poisoned.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "cuda/sm90/decode.hpp"
#include "fa4/fa4.hpp"
#include "gpu_test_util.hpp"
#include "testing/tensors.hpp"
#include "testing/tolerance.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::testing::Comparison;

struct SplitCase : GpuCase {
  std::vector<float> sinks;      // empty: none
  bool caller_workspace = false;  // a NaN-poisoned workspace of workspace_size bytes; else fa4 allocates
  std::string name() const {
    return spec().name() + " splits=" + std::to_string(options.num_splits) + (sinks.empty() ? "" : " sinks") +
           (caller_workspace ? " caller-ws" : "");
  }
};

struct SplitRun {
  std::vector<std::byte> out_bytes, lse_bytes;
  Comparison out, lse;
  size_t workspace_bytes = 0;
};

SplitRun run_split_case(const SplitCase& c, bool with_reference = true) {
  SplitRun r;
  const std::array<int64_t, 4> qshape{c.batch, c.seqlen_q, c.heads_q, c.head_dim};
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c.spec());
  auto out = HostTensor::make(c.dtype, qshape);
  auto lse = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  out.poison();
  lse.poison();
  const size_t k_elems = size_t(in.kv_storage_elems);
  DeviceCopy d_q(in.q, size_t(in.q.numel())), d_k(in.k, k_elems), d_v(in.v, k_elems), d_out(out, size_t(out.numel())),
      d_lse(lse, size_t(lse.numel()));
  EXPECT_TRUE(d_q.ok() && d_k.ok() && d_v.ok() && d_out.ok() && d_lse.ok());
  float* d_sinks = nullptr;
  fa4::Tensor sinks_host, sinks_dev;
  Options o = c.options;
  if (!c.sinks.empty()) {
    sinks_host.data = const_cast<float*>(c.sinks.data());
    sinks_host.dtype = DType::f32;
    sinks_host.rank = 1;
    sinks_host.shape = {int64_t(c.sinks.size()), 0, 0, 0};
    sinks_host.stride = {1, 0, 0, 0};
    cudaMalloc(&d_sinks, c.sinks.size() * sizeof(float));
    cudaMemcpy(d_sinks, c.sinks.data(), c.sinks.size() * sizeof(float), cudaMemcpyHostToDevice);
    sinks_dev = sinks_host;
    sinks_dev.data = d_sinks;
    sinks_dev.device = fa4::Device::cuda;
    o.sinks = &sinks_dev;
  }
  r.workspace_bytes = fa4::workspace_size(fa4::Pass::forward, d_q.desc(), d_k.desc(), d_v.desc(), o);
  fa4::Workspace ws;
  void* ws_ptr = nullptr;
  if (c.caller_workspace && r.workspace_bytes > 0) {
    EXPECT_EQ(cudaMalloc(&ws_ptr, r.workspace_bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(ws_ptr, 0xff, r.workspace_bytes), cudaSuccess);  // NaN everywhere
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // before the call's own (non-blocking) stream reads it
    ws.data = ws_ptr, ws.bytes = r.workspace_bytes;
  }
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  try {
    fa4::forward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), &d_lse.desc(), o, ws,
                 reinterpret_cast<fa4::Stream>(stream));
  } catch (const fa4::Error& e) {
    ADD_FAILURE() << c.name() << ": fa4::forward threw: " << e.what();
  }
  const cudaError_t e = cudaStreamSynchronize(stream);
  EXPECT_EQ(e, cudaSuccess) << c.name() << ": " << cudaGetErrorName(e);
  cudaStreamDestroy(stream);
  cudaFree(ws_ptr);
  cudaFree(d_sinks);
  d_out.copy_back(out);
  d_lse.copy_back(lse);
  r.out_bytes = out.storage();
  r.lse_bytes = lse.storage();
  if (!with_reference) return r;

  Options host_options = c.options;
  if (!c.sinks.empty()) host_options.sinks = &sinks_host;
  const fa4::detail::Problem p =
      fa4::detail::validate_inputs("test", in.q.desc(), in.k.desc(), in.v.desc(), host_options);
  auto out_ref = HostTensor::make(DType::f64, qshape), out_naive = HostTensor::make(DType::f64, qshape);
  auto lse_ref = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  auto lse_naive = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  fa4::cpu::reference_forward(p, in.q.desc(), in.k.desc(), in.v.desc(), out_ref.desc(), &lse_ref.desc(),
                              fa4::cpu::Precision::exact);
  fa4::cpu::reference_forward(p, in.q.desc(), in.k.desc(), in.v.desc(), out_naive.desc(), &lse_naive.desc(),
                              fa4::cpu::Precision::storage);
  const double rtol = c.options.softcap > 0 ? 3.0 : 2.0;
  r.out = fa4::testing::compare(out.values(), out_ref.values(), out_naive.values(), c.dtype, rtol, 0.0);
  r.lse = fa4::testing::compare(lse.values(), lse_ref.values(), lse_naive.values(), DType::f32, rtol, 0.0);
  return r;
}

void check_split_case(const SplitCase& c) {
  SCOPED_TRACE(c.name());
  const SplitRun r = run_split_case(c);
  EXPECT_TRUE(r.out.pass) << "out " << r.out.summary();
  EXPECT_TRUE(r.lse.pass) << "lse " << r.lse.summary();
  std::printf("  %-72s ws %7zu B  out %.3g/%.3g lse %.3g/%.3g%s\n", c.name().c_str(), r.workspace_bytes,
              r.out.max_error, r.out.bound, r.lse.max_error, r.lse.bound, r.out.pass && r.lse.pass ? "" : "  FAIL");
  std::fflush(stdout);
}

struct SplitShape {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  bool causal;
  int64_t window_left;
  float softcap;
};
// Decode (one query: packed when the group is > 1 and there is no left window), short prefill, causal with more
// keys than queries, a window, MQA, no keys, and a key range shorter than the split count.
const SplitShape kShapes[] = {
    {2, 1, 3001, 8, 2, false, -1, 0.0f},  {1, 1, 777, 4, 1, true, -1, 30.0f},  {2, 1, 1000, 6, 2, false, 100, 0.0f},
    {1, 129, 2000, 2, 2, true, -1, 0.0f}, {1, 300, 777, 6, 2, false, 200, 0.0f}, {2, 64, 0, 4, 2, false, -1, 0.0f},
    {3, 1, 5, 4, 4, false, -1, 0.0f},     {1, 5, 64, 3, 1, true, -1, 0.0f},
};

// Shape s at (dtype, head_dim) with `splits` ranges asked for.
SplitCase split_case(const SplitShape& s, DType dtype, int head_dim, int splits, uint64_t seed) {
  SplitCase c;
  c.dtype = dtype, c.head_dim = head_dim;
  c.batch = s.batch, c.seqlen_q = s.seqlen_q, c.seqlen_k = s.seqlen_k, c.heads_q = s.heads_q, c.heads_kv = s.heads_kv;
  c.options.causal = s.causal, c.options.window_left = s.window_left, c.options.softcap = s.softcap;
  c.options.num_splits = splits;
  c.seed = seed;
  return c;
}

// One sink per query head, of kinds from a large logit to -inf, picked by `seed`.
void add_sinks(SplitCase& c, uint64_t seed) {
  const float kinds[] = {0.7f, 6.0f, -30.0f, -std::numeric_limits<float>::infinity(), -1.3f, 2.5f};
  for (int64_t h = 0; h < c.heads_q; ++h) c.sinks.push_back(kinds[(h + seed) % 6]);
}

TEST(GpuSplitKvSm90, ForcedSplitsMatchTheReference) {
  REQUIRE_SM90();
  uint64_t seed = 5000;
  for (const auto& [dtype, head_dim] : compiled_instances(/*backward=*/false))
    for (const SplitShape& s : kShapes)
      for (int splits : {1, 2, 3, 7, 200}) {
        SplitCase c = split_case(s, dtype, head_dim, splits, ++seed);
        check_split_case(c);
      }
}

// The fill rule (num_splits = 0) splits decode shapes that cannot fill the GPU (a workspace is then needed) and
// leaves full ones alone; both correct.
TEST(GpuSplitKvSm90, FillRuleSplitsSmallDecodeAndNotFullPrefill) {
  REQUIRE_SM90();
  SplitCase decode;
  decode.batch = 1, decode.seqlen_q = 1, decode.seqlen_k = 4096, decode.heads_q = 32, decode.heads_kv = 8;
  decode.head_dim = 128, decode.seed = 11;
  const SplitRun r = run_split_case(decode);
  EXPECT_GT(r.workspace_bytes, 0u) << "b = 1 decode on 8 packed tiles should split";
  EXPECT_TRUE(r.out.pass && r.lse.pass) << r.out.summary() << " / " << r.lse.summary();
  std::printf("  decode b=1 s_k=4096 32/8: workspace %zu B, out %.3g/%.3g\n", r.workspace_bytes, r.out.max_error,
              r.out.bound);
  SplitCase full;
  full.batch = 4, full.seqlen_q = 2048, full.seqlen_k = 2048, full.heads_q = 16, full.heads_kv = 16;
  full.head_dim = 128, full.seed = 12;
  const SplitRun f = run_split_case(full, /*with_reference=*/false);
  EXPECT_EQ(f.workspace_bytes, 0u) << "512 tiles fill the GPU: no split";
}

// Sinks join once, in the combine; packed decode with sinks and splits; a caller's poisoned workspace.
TEST(GpuSplitKvSm90, SinksAndCallerWorkspace) {
  REQUIRE_SM90();
  uint64_t seed = 6000;
  for (const SplitShape& s : kShapes)
    for (int splits : {0, 1, 4}) {
      SplitCase c = split_case(s, SplitCase{}.dtype, 128, splits, seed + 1);
      add_sinks(c, seed++);
      c.caller_workspace = splits != 1;
      check_split_case(c);
    }
}

// The decode kernel (FA4_FWD_DECODE_KERNEL=2: every call it takes, perf-log F27; one query, no left window, no
// sink; d = 64 and 128): against the reference, forced splits (1 to 200, capped at its 64-key chunks) and the
// fill rule, a caller's poisoned workspace, groups of 1, 4 and 16, softcap, 5 keys; its bits differ from the
// forward kernel's on every call of 777 keys or more (the switch reaches another kernel). A call it does not take
// (a left window) still runs, on the forward kernel.
TEST(GpuSplitKvSm90, DecodeKernelMatchesTheReference) {
  REQUIRE_SM90();
  const SplitShape shapes[] = {{2, 1, 3001, 8, 2, false, -1, 0.0f}, {1, 1, 777, 4, 1, true, -1, 30.0f},
                               {3, 1, 5, 4, 4, false, -1, 0.0f},    {1, 1, 1000, 16, 1, true, -1, 0.0f},
                               {2, 1, 1000, 6, 2, false, 100, 0.0f}};
  uint64_t seed = 7000;
  int cases = 0, differing = 0;
  for (const auto& [dtype, head_dim] : compiled_instances(/*backward=*/false)) {
    if (head_dim > 128) continue;
    for (const SplitShape& s : shapes)
      for (int splits : {0, 1, 3, 7, 200}) {
        SplitCase c = split_case(s, dtype, head_dim, splits, ++seed);
        c.caller_workspace = splits == 0;
        SplitRun base;
        {
          const EnvOverride off("FA4_FWD_DECODE_KERNEL", "0");
          base = run_split_case(c, /*with_reference=*/false);
        }
        const EnvOverride on("FA4_FWD_DECODE_KERNEL", "2");  // every call it takes, long ranges too
        check_split_case(c);
        if (s.window_left >= 0 || s.seqlen_k < 777) continue;  // not its call, or too few keys to tell
        const SplitRun r = run_split_case(c, /*with_reference=*/false);
        ++cases, differing += r.out_bytes != base.out_bytes;
      }
  }
  EXPECT_EQ(differing, cases) << "the decode kernel's bits equal the forward kernel's in " << cases - differing
                              << " of " << cases << " calls: is FA4_FWD_DECODE_KERNEL reaching it?";
}

// The default rule (FA4_FWD_DECODE_KERNEL unset = 3, F36): the decode kernel only where the forward kernel's plan
// splits. b = 16, 32/8 heads (128 packed tiles: no split on a GPU of 132 SMs or fewer) runs the forward kernel, bit
// for bit as =0 and unlike =1 (F27's rule: wherever the ranges are short); b = 2 (16 tiles: split) the decode
// kernel, bit for bit as =1 and unlike =0. Each against the reference as well.
TEST(GpuSplitKvSm90, DecodeKernelOnlyWhereTheForwardPlanSplits) {
  REQUIRE_SM90();
  uint64_t seed = 7500;
  int checked = 0;
  for (const auto& [dtype, head_dim] : compiled_instances(/*backward=*/false)) {
    if (head_dim != 128) continue;
    for (const int64_t batch : {16, 2}) {
      SplitCase c = split_case({batch, 1, 1024, 32, 8, false, -1, 0.0f}, dtype, head_dim, 0, ++seed);
      auto run = [&](const char* kernel) {
        const EnvOverride env("FA4_FWD_DECODE_KERNEL", kernel);
        return run_split_case(c, /*with_reference=*/false).out_bytes;
      };
      const auto forward = run("0"), short_ranges = run("1"), explicit_default = run("3"), by_default = run(nullptr);
      check_split_case(c);
      SCOPED_TRACE("batch " + std::to_string(batch));
      EXPECT_NE(forward, short_ranges) << "F27's rule should run the decode kernel here";
      EXPECT_EQ(by_default, batch == 16 ? forward : short_ranges);
      EXPECT_EQ(explicit_default, by_default);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no d = 128 forward instance compiled";
}

TEST(GpuSplitKvSm90, TooSmallWorkspaceIsRefusedByName) {
  REQUIRE_SM90();
  SplitCase c;
  c.batch = 1, c.seqlen_q = 1, c.seqlen_k = 4096, c.heads_q = 8, c.heads_kv = 2, c.head_dim = 128;
  c.options.num_splits = 8;
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c.spec());
  auto out = HostTensor::make(c.dtype, {1, 1, 8, 128});
  DeviceCopy d_q(in.q, size_t(in.q.numel())), d_k(in.k, size_t(in.kv_storage_elems)),
      d_v(in.v, size_t(in.kv_storage_elems)), d_out(out, size_t(out.numel()));
  const size_t need = fa4::workspace_size(fa4::Pass::forward, d_q.desc(), d_k.desc(), d_v.desc(), c.options);
  ASSERT_GT(need, 0u);
  void* ptr = nullptr;
  CUDA_OK(cudaMalloc(&ptr, need));
  try {
    fa4::forward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), nullptr, c.options, {ptr, need - 4});
    ADD_FAILURE() << "a workspace 4 bytes short was accepted";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
  }
  cudaFree(ptr);
}

// The decode kernel's split rule counts decode_planned_ctas_per_sm CTAs per SM (its waves): the occupancy the
// device reports for its instances, which a kernel that grew past its registers (168 at three CTAs of 128 threads)
// would silently lower.
TEST(GpuSplitKvSm90, DecodeKernelHoldsItsCtasPerSm) {
  REQUIRE_SM90();
  for (DType dtype : {DType::bf16, DType::f16}) {
    EXPECT_EQ(fa4::sm90::decode_ctas_per_sm(dtype, 128), fa4::sm90::decode_planned_ctas_per_sm(128))
        << fa4::to_string(dtype);
    EXPECT_GE(fa4::sm90::decode_ctas_per_sm(dtype, 64), fa4::sm90::decode_planned_ctas_per_sm(64))
        << fa4::to_string(dtype);
  }
  EXPECT_EQ(fa4::sm90::decode_ctas_per_sm(DType::bf16, 256), 0) << "no d = 256 instance";
}

// Query heads broadcast from one stored head (stride 0) cannot be read as rows: decode runs unpacked on the
// forward kernel (FA4_FWD_DECODE_KERNEL=0), and on the decode kernel (=2) each row reads its head's row, correctly.
TEST(GpuSplitKvSm90, BroadcastQueryHeadsAreNotPacked) {
  REQUIRE_SM90();
  for (const char* kernel : {"0", "2"}) {
    SCOPED_TRACE(std::string("FA4_FWD_DECODE_KERNEL=") + kernel);
    const EnvOverride decode_kernel("FA4_FWD_DECODE_KERNEL", kernel);
    SplitCase c;
    c.batch = 2, c.seqlen_q = 1, c.seqlen_k = 1500, c.heads_q = 8, c.heads_kv = 2, c.head_dim = 64;
    c.seed = 21;
    fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c.spec());
    // q as [2, 1, 8, 64] with heads stride 0: every query head reads head 0's row.
    fa4::Tensor qb = in.q.desc();
    qb.stride[2] = 0;
    auto out = HostTensor::make(c.dtype, {2, 1, 8, 64}), out_ref = HostTensor::make(DType::f64, {2, 1, 8, 64}),
         out_naive = HostTensor::make(DType::f64, {2, 1, 8, 64});
    out.poison();
    DeviceCopy d_q(in.q, size_t(in.q.numel())), d_k(in.k, size_t(in.kv_storage_elems)),
        d_v(in.v, size_t(in.kv_storage_elems)), d_out(out, size_t(out.numel()));
    fa4::Tensor qd = d_q.desc();
    qd.stride[2] = 0;
    fa4::forward(qd, d_k.desc(), d_v.desc(), d_out.desc(), nullptr, c.options);
    CUDA_OK(cudaDeviceSynchronize());
    d_out.copy_back(out);
    const auto p = fa4::detail::validate_inputs("test", qb, in.k.desc(), in.v.desc(), c.options);
    fa4::cpu::reference_forward(p, qb, in.k.desc(), in.v.desc(), out_ref.desc(), nullptr, fa4::cpu::Precision::exact);
    fa4::cpu::reference_forward(p, qb, in.k.desc(), in.v.desc(), out_naive.desc(), nullptr,
                                fa4::cpu::Precision::storage);
    const Comparison co = fa4::testing::compare(out.values(), out_ref.values(), out_naive.values(), c.dtype, 2.0, 0.0);
    EXPECT_TRUE(co.pass) << co.summary();
  }
}

TEST(GpuSplitKvSm90, SplitRunsAreBitwiseRepeatable) {
  REQUIRE_SM90();
  SplitCase c;
  c.batch = 2, c.seqlen_q = 1, c.seqlen_k = 9000, c.heads_q = 16, c.heads_kv = 4, c.head_dim = 128;
  c.options.num_splits = 13;
  c.seed = 31;
  const SplitRun a = run_split_case(c, false), b = run_split_case(c, false);
  EXPECT_TRUE(a.out_bytes == b.out_bytes);
}

// Kernel launches of one forward call of c (caller's workspace, so no allocation nodes): its CUDA-graph capture's
// kernel nodes, into *kernels.
void kernels_in_forward(const SplitCase& c, size_t* kernels) {
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c.spec());
  auto out = HostTensor::make(c.dtype, {c.batch, c.seqlen_q, c.heads_q, c.head_dim});
  DeviceCopy d_q(in.q, size_t(in.q.numel())), d_k(in.k, size_t(in.kv_storage_elems)),
      d_v(in.v, size_t(in.kv_storage_elems)), d_out(out, size_t(out.numel()));
  const size_t bytes = fa4::workspace_size(fa4::Pass::forward, d_q.desc(), d_k.desc(), d_v.desc(), c.options);
  void* ws = nullptr;
  if (bytes > 0) CUDA_OK(cudaMalloc(&ws, bytes));
  captured_kernels(
      [&](fa4::Stream stream) {
        try {
          fa4::forward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), nullptr, c.options, {ws, bytes}, stream);
        } catch (const fa4::Error& e) {
          ADD_FAILURE() << c.name() << ": fa4::forward threw under capture: " << e.what();
        }
      },
      kernels);
  cudaFree(ws);
}

// The cluster merge (FA4_FWD_CLUSTER_COMBINE=1) against the combine kernel (=0) on one case: the same bits (the
// same merge of the same partials) and right against the reference; with launches >= 0, that many kernels in the
// call. The workspace is the caller's and NaN-poisoned, so a merge reading a partial before its range wrote
// it reads NaN, not what an earlier run left in memory the allocator hands out again.
void check_cluster_merge(SplitCase c, int launches) {
  c.caller_workspace = true;
  SCOPED_TRACE(c.name());
  const EnvOverride forward_kernel("FA4_FWD_DECODE_KERNEL", "0");  // the cluster merge is the forward kernel's
  SplitRun base;
  {
    const EnvOverride off("FA4_FWD_CLUSTER_COMBINE", "0");
    base = run_split_case(c, /*with_reference=*/false);
  }
  const EnvOverride on("FA4_FWD_CLUSTER_COMBINE", "1");
  check_split_case(c);
  const SplitRun merged = run_split_case(c, /*with_reference=*/false);
  EXPECT_TRUE(merged.out_bytes == base.out_bytes) << "out differs from the combine kernel's";
  EXPECT_TRUE(merged.lse_bytes == base.lse_bytes) << "lse differs from the combine kernel's";
  if (launches < 0) return;
  size_t kernels = 0;
  kernels_in_forward(c, &kernels);
  EXPECT_EQ(kernels, size_t(launches)) << "kernel launches of the call";
}

// Every compiled instance, packed decode and unpacked rows, masks, softcap, sinks, lse, 2 .. 16 ranges, ranges left
// empty: split or not, and merged in the forward or not, is the plan's (fewer key tiles than ranges: fewer ranges;
// more tiles than SMs: the combine kernel); the bits and the reference are checked either way.
void check_cluster_merge_over_every_instance(uint64_t& seed) {
  for (const auto& [dtype, head_dim] : compiled_instances(/*backward=*/false))
    for (const SplitShape& s : kShapes)
      for (int splits : {2, 3, 7, 16}) {
        SplitCase c = split_case(s, dtype, head_dim, splits, ++seed);
        if (seed % 3 == 0) add_sinks(c, seed);
        SCOPED_TRACE("shape " + std::to_string(&s - kShapes));
        check_cluster_merge(c, /*launches=*/-1);
      }
}

// The decode shape of the launch counts: b = 1, s_k = 16384, 32/8 heads, d = 128 (8 packed tiles), `splits` ranges.
SplitCase decode_case(int splits, uint64_t seed) {
  SplitCase c;
  c.batch = 1, c.seqlen_q = 1, c.seqlen_k = 16384, c.heads_q = 32, c.heads_kv = 8, c.head_dim = 128;
  c.options.num_splits = splits;
  c.seed = seed;
  return c;
}

// FA4_FWD_CLUSTER_COMBINE=1: a tile's ranges run as one cluster and merge in the forward (one launch, no combine
// kernel), cluster sizes 2 .. 16 (the fill rule's 16 at b = 1, s_k = 4096, 32/8), and a split too large for a
// cluster (the combine kernel then, two launches).
TEST(GpuSplitKvSm90, ClusterMergeMatchesTheCombineKernel) {
  REQUIRE_SM90();
  uint64_t seed = 7000;
  check_cluster_merge_over_every_instance(seed);
  // Launch counts where the plan is known: 2 .. 8 ranges of 8 packed tiles (clusters of up to 8, odd sizes too: one
  // launch), and 64 ranges (more than a cluster holds: the combine kernel, two). The fill rule's 16 ranges merge in clusters of
  // 16 only where the GPU runs eight of them at once (a GPC of 16 free SMs each): printed, not asserted.
  for (int splits : {2, 3, 4, 7, 8, 64, 0}) {
    const SplitCase c = decode_case(splits, ++seed);
    check_cluster_merge(c, splits == 0 ? -1 : splits == 64 ? 2 : 1);
    if (splits == 0) {
      const EnvOverride forward_kernel("FA4_FWD_DECODE_KERNEL", "0");
      const EnvOverride on("FA4_FWD_CLUSTER_COMBINE", "1");
      size_t kernels = 0;
      kernels_in_forward(c, &kernels);
      std::printf("  fill rule, b = 1 s_k = 16384 32/8 (16 ranges): %zu kernel launch(es) with the cluster merge\n",
                  kernels);
    }
  }
}

}  // namespace
