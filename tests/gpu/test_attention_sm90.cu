// The sm_90a forward kernel through the public API (fa4::forward on cuda tensors), against the fp64 reference
// with FlashAttention's tolerance rule (src/testing/tolerance.hpp), over DESIGN.md §4's sweep, for every
// compiled row of src/cuda/instances.def. Inputs are random per case; device outputs start NaN-poisoned, so an
// unwritten element fails. Also: layouts through strides (bhsd, stride-0 broadcast K/V), the exp2 emulation
// and rescale-threshold policies, determinism (two runs bitwise equal), and clear refusals of what the kernel
// cannot take (TMA-unaligned strides, the CUDA backward).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "api/device_info.hpp"
#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "fa4/fa4.hpp"
#include "testing/tensors.hpp"
#include "testing/tolerance.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::testing::HostTensor;
using fa4::testing::Layout;

bool have_sm90() {
  const auto gpus = fa4::detail::cuda_devices();
  return !gpus.empty() && gpus[0].cc_major == 9 && gpus[0].cc_minor == 0;
}

#define REQUIRE_SM90()                                                                   \
  do {                                                                                   \
    if (!have_sm90()) GTEST_SKIP() << "the sm_90a forward needs a compute capability 9.0 GPU"; \
  } while (0)

#define CUDA_OK(expr)                                                                                 \
  do {                                                                                                \
    const cudaError_t e_ = (expr);                                                                    \
    ASSERT_EQ(e_, cudaSuccess) << #expr << " -> " << cudaGetErrorName(e_) << ": " << cudaGetErrorString(e_); \
  } while (0)

// A device copy of a host tensor: same logical shape and strides, the same dense byte image.
class DeviceCopy {
 public:
  DeviceCopy(const HostTensor& h, size_t storage_elems) : bytes_(storage_elems * fa4::element_size(h.desc().dtype)) {
    if (cudaMalloc(&ptr_, std::max<size_t>(bytes_, 16)) != cudaSuccess) ptr_ = nullptr;
    if (ptr_ && bytes_) cudaMemcpy(ptr_, h.desc().data, bytes_, cudaMemcpyHostToDevice);
    desc_ = h.desc();
    desc_.data = ptr_;
    desc_.device = fa4::Device::cuda;
    desc_.device_index = 0;
  }
  ~DeviceCopy() { cudaFree(ptr_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  const fa4::Tensor& desc() const { return desc_; }
  bool ok() const { return ptr_ != nullptr; }
  void copy_back(HostTensor& h) const {
    if (bytes_) cudaMemcpy(h.desc().data, ptr_, bytes_, cudaMemcpyDeviceToHost);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  fa4::Tensor desc_;
};

struct GpuCase {
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_kv = 1, head_dim = 64;
  DType dtype = DType::bf16;
  Options options;
  Layout layout = Layout::bshd;
  bool broadcast_kv = false;  // K/V heads as stride-0 views of one stored head
  uint64_t seed = 1;
  fa4::testing::CaseSpec spec() const {
    fa4::testing::CaseSpec s;
    s.batch = batch, s.seqlen_q = seqlen_q, s.seqlen_k = seqlen_k, s.heads_q = heads_q, s.heads_kv = heads_kv;
    s.head_dim = head_dim, s.dtype = dtype, s.options = options, s.layout = layout, s.broadcast_kv = broadcast_kv;
    return s;
  }
};

struct GpuResult {
  fa4::testing::Comparison out, lse;
  std::vector<double> out_values, lse_values;
};

// Random inputs (fresh per seed), NaN-poisoned outputs, fa4::forward on the device on a non-default stream,
// then the fp64 reference (exact) and the same-precision naive baseline (storage) on the host.
GpuResult run_on_gpu(const GpuCase& c, bool with_reference = true) {
  GpuResult r;
  const std::array<int64_t, 4> qshape{c.batch, c.seqlen_q, c.heads_q, c.head_dim};
  const std::array<int64_t, 4> kshape{c.batch, c.seqlen_k, c.heads_kv, c.head_dim};
  const std::array<int64_t, 4> kstore{c.batch, c.seqlen_k, c.broadcast_kv ? 1 : c.heads_kv, c.head_dim};
  auto q = HostTensor::make(c.dtype, qshape, c.layout);
  auto k = HostTensor::make(c.dtype, kstore, c.layout);
  auto v = HostTensor::make(c.dtype, kstore, c.layout);
  q.fill_normal(c.seed * 7 + 1, c.options.softcap > 0 ? c.options.softcap / 4 : 1.0);
  k.fill_normal(c.seed * 7 + 2);
  v.fill_normal(c.seed * 7 + 3);
  const size_t k_elems = size_t(k.numel());
  if (c.broadcast_kv)
    for (auto* t : {&k, &v}) {
      t->desc().shape = kshape;
      t->desc().stride[2] = 0;
    }
  auto out = HostTensor::make(c.dtype, qshape, c.layout);
  auto lse = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  out.poison();
  lse.poison();

  DeviceCopy dq(q, size_t(q.numel())), dk(k, k_elems), dv(v, k_elems), dout(out, size_t(out.numel())),
      dlse(lse, size_t(lse.numel()));
  EXPECT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok() && dlse.ok());
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  try {
    fa4::forward(dq.desc(), dk.desc(), dv.desc(), dout.desc(), &dlse.desc(), c.options, {},
                 reinterpret_cast<fa4::Stream>(stream));
  } catch (const fa4::Error& e) {
    ADD_FAILURE() << c.spec().name() << ": fa4::forward threw: " << e.what();
  }
  const cudaError_t e = cudaStreamSynchronize(stream);
  EXPECT_EQ(e, cudaSuccess) << c.spec().name() << ": " << cudaGetErrorName(e) << " " << cudaGetErrorString(e);
  cudaStreamDestroy(stream);
  dout.copy_back(out);
  dlse.copy_back(lse);
  r.out_values = out.values();
  r.lse_values = lse.values();
  if (!with_reference) return r;

  const fa4::detail::Problem p = fa4::detail::validate_inputs("test", q.desc(), k.desc(), v.desc(), c.options);
  auto out_ref = HostTensor::make(DType::f64, qshape), out_naive = HostTensor::make(DType::f64, qshape);
  auto lse_ref = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  auto lse_naive = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  fa4::cpu::reference_forward(p, q.desc(), k.desc(), v.desc(), out_ref.desc(), &lse_ref.desc(),
                              fa4::cpu::Precision::exact);
  fa4::cpu::reference_forward(p, q.desc(), k.desc(), v.desc(), out_naive.desc(), &lse_naive.desc(),
                              fa4::cpu::Precision::storage);
  const double rtol = c.options.softcap > 0 ? 3.0 : 2.0;
  r.out = fa4::testing::compare(r.out_values, out_ref.values(), out_naive.values(), c.dtype, rtol, 0.0);
  r.lse = fa4::testing::compare(r.lse_values, lse_ref.values(), lse_naive.values(), DType::f32, rtol, 0.0);
  return r;
}

// Checks one case and prints its numbers (the record of what passed on the device).
void check_case(const GpuCase& c) {
  const std::string name = c.spec().name();
  SCOPED_TRACE(name);
  const GpuResult r = run_on_gpu(c);
  EXPECT_TRUE(r.out.pass) << name << ": out " << r.out.summary();
  EXPECT_TRUE(r.lse.pass) << name << ": lse " << r.lse.summary();
  std::printf("  %-62s out %.3g / %.3g   lse %.3g / %.3g%s\n", name.c_str(), r.out.max_error, r.out.bound,
              r.lse.max_error, r.lse.bound, r.out.pass && r.lse.pass ? "" : "   FAIL");
}

struct Instance {
  DType dtype;
  int head_dim;
};

std::vector<Instance> compiled_instances() {
  std::vector<Instance> rows;
#define FA4_IF_sm90(...) __VA_ARGS__
#define FA4_IF_sm100(...)
#define FA4_IF_fwd(...) __VA_ARGS__
#define FA4_KERNEL(arch, pass, dtype, head_dim) FA4_IF_##arch(FA4_IF_##pass(rows.push_back({DType::dtype, head_dim});))
#include "cuda/instances.def"
  return rows;
}

struct Shape {
  int64_t seqlen_q, seqlen_k;
};
// DESIGN.md §4's odd and unequal lengths, plus more queries than keys (bottom-right causal masks whole rows)
// and no keys at all (O = 0, LSE = -inf).
const Shape kSweep[] = {{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {1023, 1024}, {203, 113}, {64, 0}};

enum class MaskKind { none, causal, window };
Options options_for(MaskKind m) {
  Options o;
  if (m == MaskKind::causal) o.causal = true;
  if (m == MaskKind::window) o.window_left = 37, o.window_right = 11;
  return o;
}

// Every compiled row over the sweep × {no mask, causal, window}; head configurations MHA / GQA / MQA and
// softcap rotate over the cases so that each meets every shape class.
TEST(GpuAttentionSm90, ForwardSweepEveryInstance) {
  REQUIRE_SM90();
  const std::vector<Instance> rows = compiled_instances();
  ASSERT_FALSE(rows.empty());
  struct Heads {
    int64_t q, kv;
  };
  const Heads heads[] = {{2, 2}, {6, 2}, {3, 1}};  // MHA, GQA (group 3), MQA
  uint64_t seed = 1;
  for (const Instance& row : rows) {
    std::printf("%s head_dim %d\n", fa4::to_string(row.dtype), row.head_dim);
    int n = 0;
    for (const Shape& s : kSweep)
      for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::window}) {
        GpuCase c;
        c.dtype = row.dtype;
        c.head_dim = row.head_dim;
        c.seqlen_q = s.seqlen_q;
        c.seqlen_k = s.seqlen_k;
        c.batch = s.seqlen_q * s.seqlen_k > 100000 ? 1 : 2;
        const Heads h = heads[n % 3];
        c.heads_q = h.q;
        c.heads_kv = h.kv;
        c.options = options_for(m);
        if (n % 4 == 3) c.options.softcap = 30.0f;
        c.seed = seed++;
        check_case(c);
        ++n;
      }
  }
}

TEST(GpuAttentionSm90, LongSequenceCausal) {
  REQUIRE_SM90();
  GpuCase c;
  c.dtype = DType::bf16;
  c.head_dim = 128;
  c.seqlen_q = c.seqlen_k = 4224;
  c.heads_q = c.heads_kv = 1;
  c.options.causal = true;
  c.seed = 4224;
  check_case(c);
}

// Strides instead of copies: [b, h, s, d] storage, and K/V heads broadcast with stride 0 (TMA maps the
// broadcast dim with extent 1).
TEST(GpuAttentionSm90, LayoutsThroughStrides) {
  REQUIRE_SM90();
  for (int d : {64, 128}) {
    GpuCase c;
    c.head_dim = d;
    c.batch = 2, c.seqlen_q = 130, c.seqlen_k = 257, c.heads_q = 4, c.heads_kv = 2;
    c.layout = Layout::bhsd;
    c.seed = 900 + d;
    check_case(c);
    c.layout = Layout::bshd;
    c.broadcast_kv = true;
    c.options.causal = true;
    c.dtype = DType::f16;
    c.seed = 901 + d;
    check_case(c);
  }
}

// The numerics policy knobs: a fraction of exp2 on the FMA pipe (emulation), and the rescale threshold tau
// (0 = always rescale, 15 = the largest allowed), on inputs whose row max keeps growing (large |q|).
TEST(GpuAttentionSm90, Exp2EmulationAndRescaleThreshold) {
  REQUIRE_SM90();
  for (float fraction : {0.25f, 1.0f})
    for (float tau : {0.0f, 8.0f, 15.0f}) {
      GpuCase c;
      c.head_dim = 128;
      c.batch = 1, c.seqlen_q = 300, c.seqlen_k = 700, c.heads_q = 2, c.heads_kv = 1;
      c.options.exp2_emulated_fraction = fraction;
      c.options.rescale_threshold = tau;
      c.options.causal = tau == 8.0f;
      c.seed = uint64_t(100 * fraction + tau);
      check_case(c);
    }
}

// Determinism: the kernel has a fixed reduction order, so two runs give the same bits.
TEST(GpuAttentionSm90, TwoRunsAreBitwiseEqual) {
  REQUIRE_SM90();
  GpuCase c;
  c.head_dim = 128;
  c.batch = 2, c.seqlen_q = 517, c.seqlen_k = 1031, c.heads_q = 4, c.heads_kv = 2;
  c.options.window_left = 200;
  c.options.exp2_emulated_fraction = 0.25f;
  c.seed = 77;
  const GpuResult a = run_on_gpu(c, false), b = run_on_gpu(c, false);
  ASSERT_EQ(a.out_values.size(), b.out_values.size());
  EXPECT_EQ(std::memcmp(a.out_values.data(), b.out_values.data(), a.out_values.size() * sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(a.lse_values.data(), b.lse_values.data(), a.lse_values.size() * sizeof(double)), 0);
}

// What the kernel cannot read is refused with Status::unsupported naming the argument, before any launch.
TEST(GpuAttentionSm90, UnsupportedLayoutsAndPassesAreRefusedClearly) {
  REQUIRE_SM90();
  auto q = HostTensor::make(DType::bf16, {1, 64, 2, 64});
  q.fill_normal(1);
  DeviceCopy dq(q, size_t(q.numel())), dout(q, size_t(q.numel()));
  auto expect_unsupported = [](const std::function<void()>& f, const std::vector<std::string>& needles) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const fa4::Error& e) {
      EXPECT_EQ(e.code(), fa4::Status::unsupported) << e.what();
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
      std::printf("  refused: %s\n", e.what());
    }
  };
  // A seqlen stride of 132 elements (264 bytes) is not a multiple of 16 bytes: TMA cannot step it.
  fa4::Tensor k = dq.desc();
  k.shape = {1, 32, 2, 64};
  k.stride = {32 * 132, 132, 64, 1};
  expect_unsupported([&] { fa4::forward(dq.desc(), k, k, dout.desc(), nullptr); }, {"'k.stride[1]'", "16 bytes"});
  // A base address off 16-byte alignment (q = the first 32 rows, moved by one element).
  fa4::Tensor q_moved = dq.desc(), out32 = dout.desc();
  q_moved.data = static_cast<char*>(q_moved.data) + 2;
  q_moved.shape = out32.shape = {1, 32, 2, 64};
  expect_unsupported([&] { fa4::forward(q_moved, dq.desc(), dq.desc(), out32, nullptr); }, {"'q'", "16-byte"});
  // A head dim without a compiled kernel.
  fa4::Tensor q48 = dq.desc();
  q48.shape = {1, 16, 2, 48};
  expect_unsupported([&] { fa4::forward(q48, q48, q48, q48, nullptr); }, {"'q'", "head_dim 48"});
  // The CUDA backward does not exist yet.
  EXPECT_FALSE(fa4::supports(fa4::Pass::backward, dq.desc(), dq.desc(), dq.desc()).ok);
  EXPECT_TRUE(fa4::supports(fa4::Pass::forward, dq.desc(), dq.desc(), dq.desc()).ok);
}

}  // namespace
