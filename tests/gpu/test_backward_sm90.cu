// The sm_90a backward through the public API (fa4::backward on cuda tensors, after fa4::forward on the GPU),
// dQ, dK and dV against the fp64 reference with FlashAttention's tolerance rule (src/testing/tolerance.hpp),
// over DESIGN.md §4's sweep for every compiled bwd row of src/cuda/instances.def. Inputs are random per case;
// the gradients and the workspace start NaN-poisoned, so an unwritten element or an unzeroed accumulator
// fails. Also: layouts through strides, the caller's workspace against the stream-ordered one, and clear
// refusals of what the backward cannot take.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "cuda/sm90/bwd/config.hpp"
#include "cuda/sm90/launch.hpp"
#include "fa4/fa4.hpp"
#include "gpu_test_util.hpp"
#include "testing/tensors.hpp"
#include "testing/tolerance.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::testing::Comparison;
using fa4::testing::Layout;

// A GPU case plus where the backward's workspace comes from.
struct BwdCase : GpuCase {
  bool caller_workspace = true;  // else fa4 allocates it stream-ordered
  // > 0: out, dq, dk, dv rows (seqlen stride) padded by this many elements past h * d, so that a row is not
  // 16-byte aligned and the kernels must take their per-thread loads and stores (the gradients' pads must stay
  // untouched).
  int64_t grad_row_pad = 0;
  std::string name() const {
    return spec().name() + (caller_workspace ? "" : " own-workspace") +
           (grad_row_pad ? " grads-padded-" + std::to_string(grad_row_pad) : "");
  }
};

struct BwdResult {
  Comparison dq, dk, dv;
  std::vector<double> dq_values, dk_values, dv_values;
  int repeats_differing = 0;
  size_t pads_written = 0;  // bytes of the grad_row_pad elements that the run changed  // of the repeated backward runs, those whose dq/dk/dv bytes differ from the first
};

// Forward and backward on the device (a non-default stream), then the exact and same-precision references.
// repeats > 1: the backward runs that many times more on the same inputs, gradients re-poisoned each time, and
// each run's gradient bytes are compared with the first run's.
BwdResult run_backward_on_gpu(const BwdCase& c, bool with_reference = true, int repeats = 0) {
  BwdResult r;
  const std::array<int64_t, 4> qshape{c.batch, c.seqlen_q, c.heads_q, c.head_dim};
  const std::array<int64_t, 4> kshape{c.batch, c.seqlen_k, c.heads_kv, c.head_dim};
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c.spec());
  HostTensor &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  const size_t k_elems = size_t(in.kv_storage_elems);
  auto lse = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  // A gradient (and out): in the case's layout, or [b, s, h, d] in rows of h * d + grad_row_pad elements (pads
  // poisoned).
  const auto make_grad = [&c](const std::array<int64_t, 4>& shape) {
    if (c.grad_row_pad == 0) return HostTensor::make(c.dtype, shape, c.layout);
    const int64_t row = shape[2] * shape[3] + c.grad_row_pad;
    HostTensor t = HostTensor::make(c.dtype, {shape[0], shape[1], 1, row});
    t.poison();
    t.desc().shape = shape;
    t.desc().stride = {shape[1] * row, row, shape[3], 1};
    return t;
  };
  auto out = make_grad(qshape), dq = make_grad(qshape), dk = make_grad(kshape), dv = make_grad(kshape);
  for (auto* t : {&out, &lse, &dq, &dk, &dv}) t->poison();
  const auto storage_elems = [](const HostTensor& t) { return t.storage().size() / fa4::element_size(t.desc().dtype); };
  const std::vector<std::byte> dq_before = dq.storage(), dk_before = dk.storage(), dv_before = dv.storage();

  DeviceCopy d_q(q, size_t(q.numel())), d_k(k, k_elems), d_v(v, k_elems), d_dout(dout, size_t(dout.numel())),
      d_out(out, storage_elems(out)), d_lse(lse, size_t(lse.numel())), d_dq(dq, storage_elems(dq)),
      d_dk(dk, storage_elems(dk)), d_dv(dv, storage_elems(dv));
  EXPECT_TRUE(d_q.ok() && d_k.ok() && d_v.ok() && d_dout.ok() && d_out.ok() && d_lse.ok() && d_dq.ok() &&
              d_dk.ok() && d_dv.ok());
  fa4::Workspace ws;
  void* ws_ptr = nullptr;
  if (c.caller_workspace) {
    ws.bytes = fa4::workspace_size(fa4::Pass::backward, d_q.desc(), d_k.desc(), d_v.desc(), c.options);
    EXPECT_EQ(cudaMalloc(&ws_ptr, std::max<size_t>(ws.bytes, 16)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ws_ptr, 0xff, std::max<size_t>(ws.bytes, 16)), cudaSuccess);  // NaN everywhere
    ws.data = ws_ptr;
  }
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const auto s = reinterpret_cast<fa4::Stream>(stream);
  try {
    fa4::forward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), &d_lse.desc(), c.options, {}, s);
    fa4::backward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), d_dout.desc(), d_lse.desc(), d_dq.desc(),
                  d_dk.desc(), d_dv.desc(), c.options, ws, s);
  } catch (const fa4::Error& e) {
    ADD_FAILURE() << c.name() << ": threw: " << e.what();
  }
  const cudaError_t e = cudaStreamSynchronize(stream);
  EXPECT_EQ(e, cudaSuccess) << c.name() << ": " << cudaGetErrorName(e) << " " << cudaGetErrorString(e);
  d_dq.copy_back(dq);
  d_dk.copy_back(dk);
  d_dv.copy_back(dv);
  if (c.grad_row_pad > 0) {  // the pad elements past each row's h * d keep their poison bytes
    const auto count_pads_written = [](const HostTensor& t, const std::vector<std::byte>& before) {
      const fa4::Tensor& d = t.desc();
      const size_t esize = fa4::element_size(d.dtype), row_bytes = size_t(d.stride[1]) * esize;
      const size_t used = size_t(d.shape[2] * d.shape[3]) * esize;
      size_t written = 0;
      for (size_t row = 0; row * row_bytes < t.storage().size(); ++row)
        for (size_t b = row * row_bytes + used; b < (row + 1) * row_bytes; ++b) written += t.storage()[b] != before[b];
      return written;
    };
    r.pads_written = count_pads_written(dq, dq_before) + count_pads_written(dk, dk_before) +
                     count_pads_written(dv, dv_before);
  }
  if (repeats > 0) {
    auto again_q = HostTensor::make(c.dtype, qshape, c.layout), again_k = HostTensor::make(c.dtype, kshape, c.layout),
         again_v = HostTensor::make(c.dtype, kshape, c.layout);
    const std::pair<const DeviceCopy*, std::pair<HostTensor*, const HostTensor*>> grads[] = {
        {&d_dq, {&again_q, &dq}}, {&d_dk, {&again_k, &dk}}, {&d_dv, {&again_v, &dv}}};
    for (int run = 0; run < repeats; ++run) {
      for (const auto& g : grads)
        EXPECT_EQ(cudaMemsetAsync(g.first->desc().data, 0xff, g.second.second->storage().size(), stream), cudaSuccess);
      // The workspace NaN again too: a run that read what the previous one left (a missing dependency) would
      // otherwise see the right values.
      if (ws_ptr != nullptr) EXPECT_EQ(cudaMemsetAsync(ws_ptr, 0xff, ws.bytes, stream), cudaSuccess);
      try {
        fa4::backward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), d_dout.desc(), d_lse.desc(), d_dq.desc(),
                      d_dk.desc(), d_dv.desc(), c.options, ws, s);
      } catch (const fa4::Error& err) {
        ADD_FAILURE() << c.name() << ": repeat threw: " << err.what();
      }
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      bool same = true;
      for (const auto& g : grads) {
        g.first->copy_back(*g.second.first);
        same = same && g.second.first->storage() == g.second.second->storage();
      }
      r.repeats_differing += !same;
    }
  }
  cudaStreamDestroy(stream);
  cudaFree(ws_ptr);
  r.dq_values = dq.values(), r.dk_values = dk.values(), r.dv_values = dv.values();
  if (!with_reference) return r;

  const fa4::detail::Problem p = fa4::detail::validate_inputs("test", q.desc(), k.desc(), v.desc(), c.options);
  auto dq_ref = HostTensor::make(DType::f64, qshape), dk_ref = HostTensor::make(DType::f64, kshape),
       dv_ref = HostTensor::make(DType::f64, kshape);
  auto dq_naive = HostTensor::make(DType::f64, qshape), dk_naive = HostTensor::make(DType::f64, kshape),
       dv_naive = HostTensor::make(DType::f64, kshape);
  fa4::cpu::reference_backward(p, q.desc(), k.desc(), v.desc(), dout.desc(), dq_ref.desc(), dk_ref.desc(),
                               dv_ref.desc(), fa4::cpu::Precision::exact);
  fa4::cpu::reference_backward(p, q.desc(), k.desc(), v.desc(), dout.desc(), dq_naive.desc(), dk_naive.desc(),
                               dv_naive.desc(), fa4::cpu::Precision::storage);
  // The rule of run_case (src/testing/tolerance.cpp): rtol 2, 3 with softcap plus FlashAttention's 3e-4.
  const double rtol = c.options.softcap > 0 ? 3.0 : 2.0, atol = c.options.softcap > 0 ? 3e-4 : 0.0;
  r.dq = fa4::testing::compare(r.dq_values, dq_ref.values(), dq_naive.values(), c.dtype, rtol, atol);
  r.dk = fa4::testing::compare(r.dk_values, dk_ref.values(), dk_naive.values(), c.dtype, rtol, atol);
  r.dv = fa4::testing::compare(r.dv_values, dv_ref.values(), dv_naive.values(), c.dtype, rtol, atol);
  return r;
}

void check_backward_case(const BwdCase& c) {
  const std::string name = c.name();
  SCOPED_TRACE(name);
  const BwdResult r = run_backward_on_gpu(c);
  EXPECT_TRUE(r.dq.pass) << name << ": dq " << r.dq.summary();
  EXPECT_TRUE(r.dk.pass) << name << ": dk " << r.dk.summary();
  EXPECT_TRUE(r.dv.pass) << name << ": dv " << r.dv.summary();
  std::printf("  %-70s dq %.3g/%.3g  dk %.3g/%.3g  dv %.3g/%.3g%s\n", name.c_str(), r.dq.max_error, r.dq.bound,
              r.dk.max_error, r.dk.bound, r.dv.max_error, r.dv.bound,
              r.dq.pass && r.dk.pass && r.dv.pass ? "" : "   FAIL");
  std::fflush(stdout);  // a time limit that kills the process keeps what was printed
}

// An A/B switch's variant against its base, deterministic mode: case c with environment variable `name` at `base`,
// then at `variant`, which must be right against the reference (when `reference`), give the same bits over three
// runs, and the base's bits.
void expect_variant_matches_base_bits(const BwdCase& c, const char* name, const char* base, const char* variant,
                                      bool reference = true) {
  BwdResult base_run;
  {
    const EnvOverride at_base(name, base);
    base_run = run_backward_on_gpu(c, /*with_reference=*/false);
  }
  const EnvOverride at_variant(name, variant);
  if (reference) check_backward_case(c);
  const BwdResult r = run_backward_on_gpu(c, /*with_reference=*/false, /*repeats=*/3);
  const std::string against = std::string(" differs from ") + name + "=" + base + "'s";
  EXPECT_EQ(r.repeats_differing, 0) << c.name() << ": runs whose gradients differ from the first, of 3";
  EXPECT_TRUE(r.dq_values == base_run.dq_values) << c.name() << ": dQ" << against;
  EXPECT_TRUE(r.dk_values == base_run.dk_values) << c.name() << ": dK" << against;
  EXPECT_TRUE(r.dv_values == base_run.dv_values) << c.name() << ": dV" << against;
}

struct BwdInstance {
  DType dtype;
  int head_dim;
};
std::vector<BwdInstance> compiled_backward_instances() {
  std::vector<BwdInstance> rows;
#define FA4_IF_sm90(...) __VA_ARGS__
#define FA4_IF_sm100(...)
#define FA4_IF_fwd(...)
#define FA4_IF_bwd(...) __VA_ARGS__
#define FA4_KERNEL(arch, pass, dtype, head_dim) FA4_IF_##arch(FA4_IF_##pass(rows.push_back({DType::dtype, head_dim});))
#include "cuda/instances.def"
#undef FA4_IF_sm90
#undef FA4_IF_sm100
#undef FA4_IF_fwd
#undef FA4_IF_bwd
  return rows;
}


// DESIGN.md §4's lengths, more queries than keys (causal masks whole rows: zero, finite gradients), no keys
// (dQ = 0) and no queries (dK = dV = 0), tails of every size against the 64/128-row tiles.
const Shape kSweep[] = {{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {1023, 1024}, {203, 113}, {64, 0}, {0, 77}, {1, 300}};

TEST(GpuBackwardSm90, SweepEveryInstance) {
  REQUIRE_SM90();
  const std::vector<BwdInstance> rows = compiled_backward_instances();
  ASSERT_FALSE(rows.empty());
  uint64_t seed = 1;
  for (const BwdInstance& row : rows) {
    std::printf("%s d=%d\n", fa4::to_string(row.dtype), row.head_dim);
    for_each_sweep_case<BwdCase>(row.dtype, row.head_dim, kSweep, seed, [](BwdCase c, int n) {
      c.caller_workspace = n % 5 != 4;
      check_backward_case(c);
    });
  }
}

// Strides instead of copies: [b, h, s, d] storage, stride-0 broadcast K/V (dK, dV are per kv head).
TEST(GpuBackwardSm90, LayoutsThroughStrides) {
  REQUIRE_SM90();
  for (int d : {64, 128, 192, 256}) {
    BwdCase c;
    c.head_dim = d;
    c.batch = 2, c.seqlen_q = 130, c.seqlen_k = 257, c.heads_q = 4, c.heads_kv = 2;
    c.layout = Layout::bhsd;
    c.seed = 1900 + d;
    check_backward_case(c);
    c.layout = Layout::bshd;
    c.broadcast_kv = true;
    c.options.causal = true;
    c.dtype = DType::f16;
    c.seed = 1901 + d;
    check_backward_case(c);
  }
}

// The dK/dV epilogue's two store paths: TMA through the K/V tiles when the gradients are TMA-addressable, else
// per-thread stores; likewise the preprocess's 16-byte loads of out (else column pairs, same order of sums) and the
// postprocess's 16-byte dQ stores. Rows padded to a stride that is not a multiple of 16 bytes take the second
// paths; both are right, give the same dK/dV bits (same math, different loads and stores; dQ's order of adds may
// differ) and leave the pads alone.
TEST(GpuBackwardSm90, PaddedGradientsTakeTheDirectStoresWithTheSameBits) {
  REQUIRE_SM90();
  for (int d : {64, 128, 256}) {
    BwdCase c;
    c.head_dim = d;
    c.batch = 2, c.seqlen_q = 190, c.seqlen_k = 333, c.heads_q = 4, c.heads_kv = 2;
    c.options.causal = true;
    c.seed = 4100 + uint64_t(d);
    const BwdResult dense = run_backward_on_gpu(c, false);
    c.grad_row_pad = 2;  // 4-byte aligned element pairs, rows not 16-byte aligned
    check_backward_case(c);
    const BwdResult padded = run_backward_on_gpu(c, false);
    EXPECT_EQ(padded.pads_written, 0u) << "d=" << d;
    EXPECT_TRUE(padded.dk_values == dense.dk_values) << "d=" << d << ": dK differs between the two store paths";
    EXPECT_TRUE(padded.dv_values == dense.dv_values) << "d=" << d << ": dV differs between the two store paths";
  }
}

// Long enough that many key blocks add into the same dQ rows, and many query tiles pass one key block.
TEST(GpuBackwardSm90, LongSequence) {
  REQUIRE_SM90();
  for (int d : {64, 128, 192, 256})
    for (bool causal : {false, true}) {
      BwdCase c;
      c.head_dim = d;
      c.seqlen_q = c.seqlen_k = 2100;
      c.heads_q = 2, c.heads_kv = 1;
      c.options.causal = causal;
      c.seed = 2100 + uint64_t(d) + causal;
      check_backward_case(c);
    }
}


// The CTA pair (d = 64, 128; an option, FA4_BWD_CLUSTER=1 or multicast) against the single-CTA kernel: both right, and the same dK/dV (the
// pair's extra, fully masked tiles add exact zeros). Odd and even key-block counts (a phantom block past
// seqlen_k), causal (the pair walks the union of two ranges), a window narrower than a key block (tiles between
// the two ranges), GQA, unequal lengths.
TEST(GpuBackwardSm90, ClusterPairMatchesSingleCta) {
  REQUIRE_SM90();
  for (int d : {64, 128})
    for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::window})
      for (int64_t seqlen_k : {int64_t(3 * 128 + 17), int64_t(4 * 128)}) {
        BwdCase c;
        c.head_dim = d;
        c.batch = 2, c.seqlen_q = 333, c.seqlen_k = seqlen_k, c.heads_q = 4, c.heads_kv = 2;
        c.options = options_for(m);
        if (m == MaskKind::window) c.options.window_left = 40, c.options.window_right = 7;
        c.seed = 5200 + uint64_t(d) + uint64_t(m) * 3 + uint64_t(seqlen_k % 2);
        BwdResult single;
        {
          const EnvOverride off("FA4_BWD_CLUSTER", "0");
          check_backward_case(c);
          single = run_backward_on_gpu(c, false);
        }
        for (const char* mode : {"1", "multicast"}) {  // with the dQ exchange, and sharing Q/dO only
          const EnvOverride on("FA4_BWD_CLUSTER", mode);
          SCOPED_TRACE(std::string("FA4_BWD_CLUSTER=") + mode);
          check_backward_case(c);
          const BwdResult paired = run_backward_on_gpu(c, false);
          EXPECT_TRUE(paired.dk_values == single.dk_values) << c.name() << ": dK differs between pair and single CTA";
          EXPECT_TRUE(paired.dv_values == single.dv_values) << c.name() << ": dV differs between pair and single CTA";
        }
      }
  // Pairs with no work: no queries at all, and a narrow window far from most key blocks (whole pairs see no row;
  // their dK, dV must be zeros and nothing may wait for them).
  for (const char* mode : {"1", "multicast"})
    for (Shape sh : {Shape{0, 300}, Shape{40, 1000}}) {
      const EnvOverride on("FA4_BWD_CLUSTER", mode);
      BwdCase c;
      c.head_dim = 128;
      c.batch = 2, c.seqlen_q = sh.seqlen_q, c.seqlen_k = sh.seqlen_k, c.heads_q = 2, c.heads_kv = 1;
      c.options.window_left = 5, c.options.window_right = 5;
      c.seed = 5300 + uint64_t(sh.seqlen_q);
      SCOPED_TRACE(std::string("FA4_BWD_CLUSTER=") + mode);
      check_backward_case(c);
    }
}

// A small case for compute-sanitizer (scripts/device-check): GQA, causal, tails on both sides.
TEST(GpuBackwardSm90, Small) {
  REQUIRE_SM90();
  for (int d : {64, 128, 192, 256}) {
    BwdCase c;
    c.head_dim = d;
    c.batch = 1, c.seqlen_q = 150, c.seqlen_k = 300, c.heads_q = 2, c.heads_kv = 1;
    c.options.causal = true;
    c.seed = 150 + uint64_t(d);
    check_backward_case(c);
  }
}

// Deterministic mode: dQ slabs are added in key-block order, so 100 runs give the same bits (dK and dV are
// summed in registers and always are); and the result is still right; d = 256 takes the column-split kernel
// (dQ added from registers). Many key blocks per query tile (2k keys / 128), GQA (the CTA walks two query heads), causal and not; and a sliding window over 4k keys with
// more CTAs (256) than the GPU holds at once, where a key block's turn is not its index.
TEST(GpuBackwardSm90, DeterministicIsBitwiseReproducible) {
  REQUIRE_SM90();
  for (int d : {64, 128, 256})
    for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::window}) {
      BwdCase c;
      c.head_dim = d;
      c.batch = 2, c.seqlen_q = 700, c.seqlen_k = 2048, c.heads_q = 4, c.heads_kv = 2;
      c.options = options_for(m);
      if (m == MaskKind::window) {
        c.seqlen_q = 1500, c.seqlen_k = 4096, c.heads_q = 8, c.heads_kv = 4;
        c.options.window_left = 500, c.options.window_right = 100;
      }
      const bool causal = m == MaskKind::causal;
      c.options.deterministic = true;
      c.seed = 7000 + uint64_t(d) + causal + 2 * (m == MaskKind::window);
      check_backward_case(c);
      const BwdResult r = run_backward_on_gpu(c, /*with_reference=*/false, /*repeats=*/99);
      EXPECT_EQ(r.repeats_differing, 0) << c.name() << ": runs whose gradients differ from the first, of 99";
      std::printf("  %s: 100 runs, %d differ from the first\n", c.name().c_str(), r.repeats_differing);
      std::fflush(stdout);  // a time limit that kills the process keeps what was printed
    }
}

// Deterministic mode on a small shape, for the sanitizers (racecheck, synccheck: the turns and the two dQ writers):
// several key blocks per query tile, an odd number of query tiles (the writers take them in turn), GQA; right,
// and three more runs bitwise equal to the first.
TEST(GpuBackwardSm90, DeterministicSmall) {
  REQUIRE_SM90();
  for (int d : {64, 128, 256}) {
    BwdCase c;
    c.head_dim = d;
    c.batch = 1, c.seqlen_q = 200, c.seqlen_k = 520, c.heads_q = 2, c.heads_kv = 1;
    c.options.deterministic = true;
    c.seed = 7300 + uint64_t(d);
    check_backward_case(c);
    const BwdResult r = run_backward_on_gpu(c, /*with_reference=*/false, /*repeats=*/3);
    EXPECT_EQ(r.repeats_differing, 0) << c.name() << ": runs whose gradients differ from the first, of 3";
  }
}

// The deterministic turn helpers of the column-split rows (the default; FA4_BWD_DET_HELPER=0 is off): right, the
// same bits as the warpgroups passing the turns themselves (the adds happen in the same key-block order), and
// bitwise repeatable; causal (a block's turn is not its index) and GQA.
TEST(GpuBackwardSm90, DeterministicTurnHelpersMatchTheInlineTurns) {
  REQUIRE_SM90();
  for (int d : {192, 256})
    for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
      BwdCase c;
      c.head_dim = d;
      c.batch = 1, c.seqlen_q = 200, c.seqlen_k = 520, c.heads_q = 2, c.heads_kv = 1;
      c.options = options_for(m);
      c.options.deterministic = true;
      c.seed = 7400 + uint64_t(d) + uint64_t(m);
      BwdResult inline_turns;
      {
        const EnvOverride off("FA4_BWD_DET_HELPER", "0");
        inline_turns = run_backward_on_gpu(c, false);
      }
      const EnvOverride on("FA4_BWD_DET_HELPER", "1");
      check_backward_case(c);
      const BwdResult helped = run_backward_on_gpu(c, false, /*repeats=*/3);
      EXPECT_EQ(helped.repeats_differing, 0) << c.name() << ": runs whose gradients differ from the first, of 3";
      EXPECT_TRUE(helped.dq_values == inline_turns.dq_values) << c.name() << ": dQ differs from the inline turns";
      EXPECT_TRUE(helped.dk_values == inline_turns.dk_values) << c.name() << ": dK differs from the inline turns";
    }
}

// Deterministic mode in 1 to 4 turn chains (FA4_BWD_DET_CHAINS; key block n adds into accumulator copy n % chains
// in the chain's own order, the postprocess sums the copies): right, and bitwise repeatable; with and without the
// dQ writer's per-slab turn release (FA4_BWD_DET_SLAB_RELEASE, key-split rows) and the column-split rows' turn
// helpers. Causal and a sliding window (a block's turn is not its index), GQA; grids of up to 1024 CTAs, more than
// the GPU holds at once (a block must never wait for one launched after it). The workspace grows by the copies.
TEST(GpuBackwardSm90, DeterministicChainsAreRightAndRepeatable) {
  REQUIRE_SM90();
  const EnvOverride chains_not_rotated("FA4_BWD_DET_ROTATED", "0");  // the chains, whatever the default
  auto run = [](BwdCase c, const char* what) {
    SCOPED_TRACE(what);
    check_backward_case(c);
    const BwdResult r = run_backward_on_gpu(c, /*with_reference=*/false, /*repeats=*/3);
    EXPECT_EQ(r.repeats_differing, 0) << c.name() << " " << what << ": runs whose gradients differ from the first, of 3";
  };
  for (const char* chains : {"1", "2", "3", "4"}) {
    const EnvOverride chain_count("FA4_BWD_DET_CHAINS", chains);
    for (const char* release : {"0", "1"}) {
      const EnvOverride slab_release("FA4_BWD_DET_SLAB_RELEASE", release);
      // The writers' paths (d = 128 unmasked adds from registers by default; DeterministicRegisterAddsMatchTheWriters
      // runs those against these in chains 1 and 4).
      const EnvOverride writers("FA4_BWD_DET_REGISTER_ADDS", "0");
      for (int d : {64, 128, 192, 256})
        for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::window}) {
          if (d >= 192 && std::string(release) == "1") continue;  // column-split rows have no dQ writer
          BwdCase c;
          c.head_dim = d;
          c.batch = 1, c.seqlen_q = 333, c.seqlen_k = 1100, c.heads_q = 2, c.heads_kv = 1;
          c.options = options_for(m);
          if (m == MaskKind::window) c.options.window_left = 300, c.options.window_right = 40;
          c.options.deterministic = true;
          c.seed = 7600 + uint64_t(d) + uint64_t(m);
          run(c, (std::string("chains ") + chains + ", slab release " + release).c_str());
        }
    }
    for (int d : {64, 256}) {  // 256 and 512 CTAs
      BwdCase c;
      c.head_dim = d;
      c.batch = 2, c.seqlen_q = 100, c.seqlen_k = 4096, c.heads_q = 8, c.heads_kv = 4;
      c.options.deterministic = true;
      c.seed = 7700 + uint64_t(d);
      run(c, (std::string("chains ") + chains + ", more CTAs than the GPU holds").c_str());
    }
    for (int d : {192, 256}) {  // the column-split warpgroups passing their turns themselves
      const EnvOverride inline_turns("FA4_BWD_DET_HELPER", "0");
      BwdCase c;
      c.head_dim = d;
      c.batch = 1, c.seqlen_q = 333, c.seqlen_k = 1100, c.heads_q = 2, c.heads_kv = 1;
      c.options.causal = true, c.options.deterministic = true;
      c.seed = 7800 + uint64_t(d);
      run(c, (std::string("chains ") + chains + ", no turn helpers").c_str());
    }
  }
  // The workspace holds one accumulator copy and counter set per chain, in deterministic mode only; unset, the
  // count is the tile row's (kBwdTiles: 1 at d = 128; at d = 64 4 without a mask, 1 with one), at most 2 up to
  // 1024 keys (kShortKeysDetChains; x64 has 512, x64_long 1100).
  auto q = HostTensor::make(DType::bf16, {2, 512, 4, 128});
  q.fill_normal(1);
  auto q64 = HostTensor::make(DType::bf16, {2, 512, 4, 64});
  q64.fill_normal(2);
  auto q64_long = HostTensor::make(DType::bf16, {2, 1100, 4, 64});
  q64_long.fill_normal(3);
  DeviceCopy t(q, size_t(q.numel())), t64(q64, size_t(q64.numel())), t64_long(q64_long, size_t(q64_long.numel()));
  const fa4::Tensor& x = t.desc();
  const fa4::Tensor& x64 = t64.desc();
  const fa4::Tensor& x64_long = t64_long.desc();
  fa4::Options det;
  det.deterministic = true;
  auto bytes = [&](const char* chains, const fa4::Options& o, const fa4::Tensor& in) {
    const EnvOverride chain_count("FA4_BWD_DET_CHAINS", chains);
    return fa4::workspace_size(fa4::Pass::backward, in, in, in, o);
  };
  const size_t accum = size_t(2) * 4 * 512 * 128 * 4;  // one fp32 dQ copy
  EXPECT_GE(bytes("4", det, x), bytes("1", det, x) + 3 * accum);
  EXPECT_GE(bytes("2", det, x), bytes("1", det, x) + accum);
  EXPECT_EQ(bytes("4", fa4::Options{}, x), bytes("1", fa4::Options{}, x));
  EXPECT_EQ(bytes(nullptr, det, x), bytes("1", det, x));
  EXPECT_EQ(bytes(nullptr, det, x64), bytes("2", det, x64));
  EXPECT_LT(bytes(nullptr, det, x64), bytes("4", det, x64));
  EXPECT_EQ(bytes(nullptr, det, x64_long), bytes("4", det, x64_long));
  fa4::Options det_causal = det;
  det_causal.causal = true;
  EXPECT_EQ(bytes(nullptr, det_causal, x64), bytes("1", det_causal, x64));
  EXPECT_LT(bytes(nullptr, det_causal, x64), bytes(nullptr, det, x64));
}

// FA4_BWD_DET_ROTATED=1 (perf-log B29): the rotated walk on a persistent cooperative grid, every row: right and
// bitwise repeatable, and the path the launch takes (asked of backward_paths with this GPU's SM count, so a shape
// that fell back to the chains would fail here, not pass as the chains). Tails on both sides; grids with many work
// items per CTA (a (batch, kv head) per round), under every deterministic switch and FA4_BWD_PDL; and 4096 keys (32 key blocks on
// 32 positions: every block starts on its own position).
TEST(GpuBackwardSm90, DeterministicRotatedWalkIsRightAndRepeatable) {
  REQUIRE_SM90();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  const EnvOverride rotated("FA4_BWD_DET_ROTATED", "1");
  auto takes_the_rotated_walk = [&](const BwdCase& c) {
    static std::vector<uint16_t> buffer(1);  // descriptors only: validate_inputs reads shapes, never data
    const auto desc = [&](int64_t s, int64_t h) {
      return fa4::Tensor::contiguous(buffer.data(), DType::bf16, fa4::Device::cpu, {c.batch, s, h, c.head_dim});
    };
    const auto problem = fa4::detail::validate_inputs("test", desc(c.seqlen_q, c.heads_q),
                                                      desc(c.seqlen_k, c.heads_kv), desc(c.seqlen_k, c.heads_kv),
                                                      c.options);
    return fa4::sm90::backward_paths(problem, false, sms).det_rotated_walk;
  };
  auto run = [&](BwdCase c, const std::string& what) {
    SCOPED_TRACE(what);
    c.options.deterministic = true;
    ASSERT_TRUE(takes_the_rotated_walk(c)) << c.name() << " " << what;
    check_backward_case(c);
    const BwdResult r = run_backward_on_gpu(c, /*with_reference=*/false, /*repeats=*/3);
    EXPECT_EQ(r.repeats_differing, 0) << c.name() << " " << what << ": runs whose gradients differ from the first, of 3";
  };
  // Per row, group 2 and tails: d = 64 (128 × 128 tiles) 3 query tiles per head, 6 key blocks; d = 128 (64 × 128)
  // 5 and 9; d = 192 and 256 (64 × 64) 5 and 10 (every position a start).
  const int dims[] = {64, 128, 192, 256};
  const int64_t seqlen_k_of[] = {700, 1100, 600, 600};
  for (int row = 0; row < 4; ++row) {
    const int d = dims[row];
    BwdCase c;
    c.head_dim = d;
    c.batch = 2, c.seqlen_q = 300, c.seqlen_k = seqlen_k_of[row], c.heads_q = 4, c.heads_kv = 2;
    c.seed = 7900 + uint64_t(d);
    run(c, "tails");
  }
  // Many items per CTA: 32 (batch, kv head)s (d = 256: 10 key blocks, 320 items on 13 rounds of 10 CTAs at one CTA
  // per SM), under each deterministic switch.
  const std::pair<const char*, const char*> switches[] = {
      {"FA4_BWD_DET_HELPER", "0"},       {"FA4_BWD_DET_STORE_FIRST", "0"}, {"FA4_BWD_DET_REGISTER_ADDS", "0"},
      {"FA4_BWD_DET_REGISTER_ADDS", "1"}, {"FA4_BWD_DET_TWO_BUFFERS", "0"}, {"FA4_BWD_DET_SLAB_RELEASE", "0"},
      {"FA4_BWD_DET_CHAINS", "4"},       {"FA4_BWD_PDL", "1"}};
  for (int d : {64, 128, 256}) {
    BwdCase c;
    c.head_dim = d;
    c.batch = 4, c.seqlen_q = 320, c.seqlen_k = d == 64 ? 640 : 600, c.heads_q = 16, c.heads_kv = 8;
    c.seed = 7950 + uint64_t(d);
    run(c, "many items per CTA");
    if (d != 256) continue;
    for (const auto& [name, value] : switches) {
      const EnvOverride override(name, value);
      run(c, std::string("many items per CTA, ") + name + "=" + value);
    }
  }
  for (const auto& [name, value] : switches) {  // the key-split writers (d = 64's default) and register adds
    if (std::string(name) == "FA4_BWD_DET_HELPER") continue;
    const EnvOverride override(name, value);
    BwdCase c;
    c.head_dim = 64;
    c.batch = 4, c.seqlen_q = 320, c.seqlen_k = 600, c.heads_q = 8, c.heads_kv = 4;
    c.seed = 7960;
    run(c, std::string("d = 64, ") + name + "=" + value);
  }
  BwdCase c;  // 4096 keys: 32 key blocks of 128 (d = 64) on 2 heads × 16 query tiles
  c.head_dim = 64;
  c.batch = 1, c.seqlen_q = 2048, c.seqlen_k = 4096, c.heads_q = 2, c.heads_kv = 1;
  c.seed = 7990;
  run(c, "4096 keys");
  // The workspace holds the walk's one accumulator copy (its chains' otherwise): q [2, 2048, 4, 256], 32 key
  // blocks of 64 on 32 positions, 4 chains without the walk.
  auto q = HostTensor::make(DType::bf16, {2, 2048, 4, 256});
  q.fill_normal(1);
  DeviceCopy t(q, size_t(q.numel()));
  fa4::Options det;
  det.deterministic = true;
  auto bytes = [&](const char* rotated, const char* chains) {
    const EnvOverride walk("FA4_BWD_DET_ROTATED", rotated), chain_count("FA4_BWD_DET_CHAINS", chains);
    return fa4::workspace_size(fa4::Pass::backward, t.desc(), t.desc(), t.desc(), det);
  };
  const size_t accum = size_t(2) * 4 * 2048 * 256 * 4;  // one fp32 dQ copy
  EXPECT_EQ(bytes("1", nullptr), bytes("0", "1"));
  EXPECT_EQ(bytes("1", "4"), bytes("0", "1"));  // the count does not apply to the walk
  EXPECT_GE(bytes("0", nullptr), bytes("1", nullptr) + 3 * accum);
}

// FA4_BWD_DET_STORE_FIRST=1: each chain's first adder stores its slab (nothing zeroed; the postprocess skips a copy
// whose counter stayed 0): the same values as the zeroed copies (stored as a reduce into zero would leave them),
// right, repeatable; one and two chains, every row kind (the writer's bulk store, the register stores with and
// without the turn helpers), causal and a window; and fewer keys than queries, causal, where tiles see no key
// (no copy written) and the second chain visits none (one key block at d <= 128).
TEST(GpuBackwardSm90, DeterministicStoreFirstMatchesTheZeroedCopies) {
  REQUIRE_SM90();
  for (const char* chains : {"1", "2", "4"})
    for (const char* helpers : {"1", "0"})
      for (int d : {64, 128, 192, 256})
        for (int shape = 0; shape < 4; ++shape) {
          const MaskKind m = shape == 3 ? MaskKind::causal : static_cast<MaskKind>(shape);
          if (d <= 128 && std::string(helpers) == "0") continue;  // the turn helpers are column-split rows'
          const EnvOverride chain_count("FA4_BWD_DET_CHAINS", chains);
          const EnvOverride turn_helpers("FA4_BWD_DET_HELPER", helpers);
          BwdCase c;
          c.head_dim = d;
          c.batch = 2, c.seqlen_q = 333, c.seqlen_k = shape == 3 ? 100 : 1100, c.heads_q = 4, c.heads_kv = 2;
          c.options = options_for(m);
          if (m == MaskKind::window) c.options.window_left = 300, c.options.window_right = 40;
          c.options.deterministic = true;
          c.seed = 7900 + uint64_t(d) + uint64_t(shape);
          SCOPED_TRACE(std::string("chains ") + chains + ", helpers " + helpers + ", shape " + std::to_string(shape));
          expect_variant_matches_base_bits(c, "FA4_BWD_DET_STORE_FIRST", "0", "1");  // against the zeroed copies
        }
}

// FA4_BWD_DET_TWO_BUFFERS: deterministic d = 128 (and d = 64 with B27's define) stages each warpgroup's slabs in
// two buffers (one per dQ writer) by default; the same bits as one buffer, right against the reference,
// repeatable, with one chain and two, every mask, GQA, tails, and a walk of many tiles per CTA (both writers'
// buffers cycling).
TEST(GpuBackwardSm90, DeterministicTwoBuffersMatchOne) {
  REQUIRE_SM90();
  const EnvOverride writers("FA4_BWD_DET_REGISTER_ADDS", "0");  // unmasked d = 128 has no writers by default (B24)
  for (const fa4::sm90::BwdTile& tile : fa4::sm90::kBwdTiles) {
    if (tile.det_staging_buffers != 2) continue;  // the rows with two buffers: d = 128 (d = 64 too in B27's build)
    for (const char* chains : {"1", "2"})
      for (int shape = 0; shape < 4; ++shape) {
        const MaskKind m = shape == 3 ? MaskKind::causal : static_cast<MaskKind>(shape);
        const EnvOverride chain_count("FA4_BWD_DET_CHAINS", chains);
        BwdCase c;
        c.head_dim = tile.head_dim;
        c.batch = 2, c.seqlen_q = shape == 3 ? 1000 : 333, c.seqlen_k = 1100, c.heads_q = 4, c.heads_kv = 2;
        c.options = options_for(m);
        if (m == MaskKind::window) c.options.window_left = 300, c.options.window_right = 40;
        c.options.deterministic = true;
        c.seed = 8500 + uint64_t(shape);
        SCOPED_TRACE(std::string("d ") + std::to_string(tile.head_dim) + ", chains " + chains + ", shape " +
                     std::to_string(shape));
        expect_variant_matches_base_bits(c, "FA4_BWD_DET_TWO_BUFFERS", "0", "1");
      }
  }
  // One head per kv head: a CTA stages 1 or 3 slabs (buffer 1 never used; an odd last stage), right and repeatable.
  for (int seqlen_q : {64, 150}) {
    BwdCase c;
    c.head_dim = 128;
    c.batch = 2, c.seqlen_q = seqlen_q, c.seqlen_k = 700, c.heads_q = 2, c.heads_kv = 2;
    c.options.deterministic = true;
    c.seed = 8550 + uint64_t(seqlen_q);
    SCOPED_TRACE("one head per kv head, seqlen_q " + std::to_string(seqlen_q));
    check_backward_case(c);
    EXPECT_EQ(run_backward_on_gpu(c, /*with_reference=*/false, /*repeats=*/3).repeats_differing, 0) << c.name();
  }
}

// FA4_BWD_PDL=1: the main kernel and the postprocess launched as programmatic dependents of the kernel before each
// (their set-up overlaps its tail; each waits for it before touching global memory): right, and in deterministic
// mode the same bits as plain launches; every row kind, causal and not, GQA, tails.
TEST(GpuBackwardSm90, ProgrammaticLaunchesMatchThePlainOnes) {
  REQUIRE_SM90();
  for (int d : {64, 128, 192, 256})
    for (int shape = 0; shape < 3; ++shape) {
      const bool causal = shape == 1;
      BwdCase c;
      c.head_dim = d;
      c.batch = 2, c.seqlen_q = 333, c.seqlen_k = 1100, c.heads_q = 4, c.heads_kv = 2;
      // and a preprocess of several waves (the main kernel's wait matters for longer)
      if (shape == 2) c.batch = 4, c.seqlen_q = 2048, c.seqlen_k = 512, c.heads_q = 16, c.heads_kv = 4;
      c.options.causal = causal, c.options.deterministic = true;
      c.seed = 8000 + uint64_t(d) + uint64_t(shape);
      const bool reference = shape < 2;  // the several-wave case is checked against the plain launches' bits only
      expect_variant_matches_base_bits(c, "FA4_BWD_PDL", "0", "1", reference);
      const EnvOverride on("FA4_BWD_PDL", "1");
      c.options.deterministic = false;  // and the default mode, against the reference
      if (reference) check_backward_case(c);
    }
}

// The CTA pair (FA4_BWD_CLUSTER: 1 with its dQ exchange, multicast without) at d = 64 and 128, one causal, GQA,
// against the reference, under whatever switches the caller set.
void check_cta_pair_cases(uint64_t seed) {
  for (const char* pair : {"1", "multicast"})
    for (int d : {64, 128}) {
      const EnvOverride cluster("FA4_BWD_CLUSTER", pair);
      BwdCase c;
      c.head_dim = d;
      c.batch = 2, c.seqlen_q = 333, c.seqlen_k = 700, c.heads_q = 4, c.heads_kv = 2;
      c.options.causal = d == 64;
      c.seed = seed + uint64_t(d);
      SCOPED_TRACE(std::string("FA4_BWD_CLUSTER=") + pair);
      check_backward_case(c);
    }
}

// FA4_BWD_DET_REGISTER_ADDS=1: deterministic key-split rows add their dQ slabs from registers in their turns
// (helper warps pass them) instead of staging them for the writers: right, repeatable, and the same bits as the
// writers' bulk adds (the same fp32 additions in the same order), with store-first and zeroed copies, one chain
// and several, every mask, GQA, tails.
TEST(GpuBackwardSm90, DeterministicRegisterAddsMatchTheWriters) {
  REQUIRE_SM90();
  for (int d : {64, 128})
    for (const char* chains : {"1", "4"})
      for (const char* store_first : {"1", "0"})
        for (int shape = 0; shape < 4; ++shape) {
          const MaskKind m = shape == 3 ? MaskKind::causal : static_cast<MaskKind>(shape);
          const EnvOverride chain_count("FA4_BWD_DET_CHAINS", chains);
          const EnvOverride first("FA4_BWD_DET_STORE_FIRST", store_first);
          BwdCase c;
          c.head_dim = d;
          c.batch = 2, c.seqlen_q = shape == 3 ? 1000 : 333, c.seqlen_k = 1100, c.heads_q = 4, c.heads_kv = 2;
          c.options = options_for(m);
          if (m == MaskKind::window) c.options.window_left = 300, c.options.window_right = 40;
          c.options.deterministic = true;
          c.seed = 8600 + uint64_t(d) + uint64_t(shape);
          SCOPED_TRACE(std::string("chains ") + chains + ", store-first " + store_first + ", shape " +
                       std::to_string(shape));
          expect_variant_matches_base_bits(c, "FA4_BWD_DET_REGISTER_ADDS", "0", "1",
                                           /*reference=*/std::string(store_first) == "1");  // against the writers
        }
}

// FA4_BWD_DQ_REGISTER_ADDS: the key-split rows' warpgroups add their dQ slabs from registers (no staging, no
// writer; the default at d = 128) or stage them for the writer's bulk reduce-add (the default at d = 64), each
// forced on every key-split row: the masks, GQA, tails. The column-split rows are unaffected but checked under the
// switch too, and so is the CTA pair, which keeps its writer.
TEST(GpuBackwardSm90, DqRegisterAddsAndStagingMatchTheReference) {
  REQUIRE_SM90();
  for (const char* adds : {"1", "0"}) {
    const EnvOverride on("FA4_BWD_DQ_REGISTER_ADDS", adds);
    SCOPED_TRACE(std::string("FA4_BWD_DQ_REGISTER_ADDS=") + adds);
    for (int d : {64, 128, 192, 256})
      for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::window}) {
        if (d > 128 && adds[0] == '0') continue;  // column-split rows: the switch does not apply
        BwdCase c;
        c.head_dim = d;
        c.batch = 2, c.seqlen_q = 333, c.seqlen_k = 1100, c.heads_q = 4, c.heads_kv = 2;
        c.options = options_for(m);
        if (m == MaskKind::window) c.options.window_left = 300, c.options.window_right = 40;
        c.seed = 8100 + uint64_t(d) + uint64_t(m) + (adds[0] == '0' ? 50u : 0u);
        check_backward_case(c);
      }
    check_cta_pair_cases(adds[0] == '0' ? 8250 : 8200);  // the pair keeps its dQ exchange and writer: no hang
  }
}

// What the backward cannot take is refused with a message naming the argument, before anything is written.
TEST(GpuBackwardSm90, RefusalsNameTheArgument) {
  REQUIRE_SM90();
  auto q = HostTensor::make(DType::bf16, {1, 64, 2, 64});
  q.fill_normal(1);
  auto grad = HostTensor::make(DType::bf16, {1, 64, 2, 64});
  grad.poison();
  auto lse = HostTensor::make_lse({1, 2, 64});
  lse.fill_normal(2);
  DeviceCopy t(q, size_t(q.numel())), g(grad, size_t(grad.numel())), gk(grad, size_t(grad.numel())),
      gv(grad, size_t(grad.numel())), l(lse, size_t(lse.numel()));
  auto expect_error = [](fa4::Status code, const std::function<void()>& f, const std::vector<std::string>& needles) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const fa4::Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
      std::printf("  refused: %s\n", e.what());
    }
  };
  const fa4::Tensor& x = t.desc();
  EXPECT_TRUE(fa4::supports(fa4::Pass::backward, x, x, x).ok);
  {  // a bad A/B override of the CTA pair is an error that names it, not a silent default
    const EnvOverride bad("FA4_BWD_CLUSTER", "yes");
    expect_error(fa4::Status::invalid_argument,
                 [&] { fa4::backward(x, x, x, x, x, l.desc(), g.desc(), gk.desc(), gv.desc()); },
                 {"FA4_BWD_CLUSTER", "'yes'"});
    fa4::Options det;  // also where the pair would not apply; and supports() says so beforehand
    det.deterministic = true;
    expect_error(fa4::Status::invalid_argument,
                 [&] { fa4::backward(x, x, x, x, x, l.desc(), g.desc(), gk.desc(), gv.desc(), det); },
                 {"FA4_BWD_CLUSTER", "'yes'"});
    const fa4::Support s = fa4::supports(fa4::Pass::backward, x, x, x);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find("FA4_BWD_CLUSTER"), std::string::npos) << s.reason;
  }
  // and of the deterministic turn helpers, chains, rotated walk and slab release (checked on every call, as the
  // pair's): a value no switch takes (the chain count takes 1 to 4 since B28)
  for (const char* name :
       {"FA4_BWD_DET_HELPER", "FA4_BWD_DET_CHAINS", "FA4_BWD_DET_SLAB_RELEASE", "FA4_BWD_DET_STORE_FIRST",
        "FA4_BWD_DET_TWO_BUFFERS", "FA4_BWD_DET_REGISTER_ADDS", "FA4_BWD_DET_ROTATED", "FA4_BWD_PDL",
        "FA4_BWD_DQ_REGISTER_ADDS"}) {
    const EnvOverride bad(name, "5");
    expect_error(fa4::Status::invalid_argument,
                 [&] { fa4::backward(x, x, x, x, x, l.desc(), g.desc(), gk.desc(), gv.desc()); }, {name, "'5'"});
    EXPECT_FALSE(fa4::supports(fa4::Pass::backward, x, x, x).ok) << name;
  }
  fa4::Tensor x80 = x;  // a head dim without a CUDA kernel: refused, not sent to the CPU
  x80.shape = {1, 16, 2, 80};
  x80.stride = {16 * 2 * 80, 2 * 80, 80, 1};
  const fa4::Support s80 = fa4::supports(fa4::Pass::backward, x80, x80, x80);
  EXPECT_FALSE(s80.ok);
  EXPECT_EQ(s80.code, fa4::Status::unsupported);
  EXPECT_NE(s80.reason.find("'q'"), std::string::npos) << s80.reason;
  EXPECT_NE(s80.reason.find("head_dim 80"), std::string::npos) << s80.reason;
  fa4::Tensor x256 = x;  // every forward head dim has a backward kernel
  x256.shape = {1, 16, 2, 256};
  x256.stride = {16 * 2 * 256, 2 * 256, 256, 1};
  EXPECT_TRUE(fa4::supports(fa4::Pass::backward, x256, x256, x256).ok);
  fa4::Tensor dout_bad = x;  // a seqlen stride of 132 elements: not a multiple of 16 bytes
  dout_bad.shape = {1, 32, 2, 64};
  dout_bad.stride = {32 * 132, 132, 64, 1};
  fa4::Tensor x32 = x, g32 = g.desc(), gk32 = gk.desc(), gv32 = gv.desc(), l32 = l.desc();
  x32.shape = g32.shape = gk32.shape = gv32.shape = {1, 32, 2, 64};
  l32.shape = {1, 2, 32};
  expect_error(fa4::Status::unsupported, [&] { fa4::backward(x32, x32, x32, x32, dout_bad, l32, g32, gk32, gv32); },
               {"'dout.stride[1]'"});
  expect_error(fa4::Status::invalid_argument,
               [&] { fa4::backward(x, x, x, x, x, l.desc(), g.desc(), gk.desc(), gv.desc(), {}, {l.desc().data, 64}); },
               {"'workspace'"});
  expect_error(fa4::Status::invalid_argument,
               [&] { fa4::backward(x, x, x, x, x, l.desc(), x, gk.desc(), gv.desc()); }, {"'dq'"});
  CUDA_OK(cudaDeviceSynchronize());
  for (const DeviceCopy* d : {&g, &gk, &gv}) {
    d->copy_back(grad);
    size_t nan = 0;
    for (double v : grad.values()) nan += v != v;
    EXPECT_EQ(nan, size_t(grad.numel())) << "a refused call wrote a gradient";
  }
}

}  // namespace
