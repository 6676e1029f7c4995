// Attention sinks (Options::sinks, Options::dsinks) on the sm_90a kernels, through the public API on cuda tensors:
// out and lse against the fp64 reference with the tolerance rule (forward), dq, dk and dv likewise (backward, with
// D taken from the kernel's stored out in both references),
// for every compiled forward and backward row, over masks that leave rows with no visible key, GQA, softcap,
// empty sides, and sinks of every kind (small, dominant, very negative, -inf). dsinks is checked twice: tightly
// against the same sum taken in fp64 from the kernel's own out and lse (what the sink-gradient kernel sums), and
// against the fp64 reference within the error the dtype's rounding of out allows. Outputs start NaN-poisoned.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "fa4/fa4.hpp"
#include "gpu_test_util.hpp"
#include "testing/tensors.hpp"
#include "testing/tolerance.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::testing::Comparison;

// An fp32 [n] vector in host memory and its device copy.
struct SinkVector {
  std::vector<float> host;
  fa4::Tensor host_desc, device_desc;
  float* device = nullptr;
  explicit SinkVector(std::vector<float> values) : host(std::move(values)) {
    host_desc.data = host.data();
    host_desc.dtype = DType::f32;
    host_desc.rank = 1;
    host_desc.shape = {int64_t(host.size()), 0, 0, 0};
    host_desc.stride = {1, 0, 0, 0};
    cudaMalloc(&device, std::max<size_t>(host.size(), 1) * sizeof(float));
    cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
    device_desc = host_desc;
    device_desc.data = device;
    device_desc.device = fa4::Device::cuda;
  }
  ~SinkVector() { cudaFree(device); }
  SinkVector(const SinkVector&) = delete;
  SinkVector& operator=(const SinkVector&) = delete;
  std::vector<float> copy_back() const {
    std::vector<float> v(host.size());
    cudaMemcpy(v.data(), device, v.size() * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
  }
};

std::vector<float> sink_values(int64_t heads, uint64_t seed) {
  const float kinds[] = {0.7f, 6.0f, -30.0f, -std::numeric_limits<float>::infinity(), -1.3f, 2.5f};
  std::vector<float> v;
  for (int64_t h = 0; h < heads; ++h) v.push_back(kinds[(h + seed) % 6]);
  return v;
}

struct SinkCase : GpuCase {
  bool backward = true;
  std::string name() const { return spec().name() + " sinks"; }
};


void check_sink_case(const SinkCase& c) {
  SCOPED_TRACE(c.name());
  const std::array<int64_t, 4> qshape{c.batch, c.seqlen_q, c.heads_q, c.head_dim};
  const std::array<int64_t, 4> kshape{c.batch, c.seqlen_k, c.heads_kv, c.head_dim};
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c.spec());
  HostTensor &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  const size_t k_elems = size_t(in.kv_storage_elems);
  auto out = HostTensor::make(c.dtype, qshape), dq = HostTensor::make(c.dtype, qshape);
  auto dk = HostTensor::make(c.dtype, kshape), dv = HostTensor::make(c.dtype, kshape);
  auto lse = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  for (auto* t : {&out, &lse, &dq, &dk, &dv}) t->poison();
  const SinkVector sinks(sink_values(c.heads_q, c.seed));
  SinkVector dsinks(std::vector<float>(size_t(c.heads_q), std::numeric_limits<float>::quiet_NaN()));

  DeviceCopy d_q(q, size_t(q.numel())), d_k(k, k_elems), d_v(v, k_elems), d_dout(dout, size_t(dout.numel())),
      d_out(out, size_t(out.numel())), d_lse(lse, size_t(lse.numel())), d_dq(dq, size_t(dq.numel())),
      d_dk(dk, size_t(dk.numel())), d_dv(dv, size_t(dv.numel()));
  ASSERT_TRUE(d_q.ok() && d_k.ok() && d_v.ok() && d_dout.ok() && d_out.ok() && d_lse.ok() && d_dq.ok() && d_dk.ok() &&
              d_dv.ok() && sinks.device && dsinks.device);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto s = reinterpret_cast<fa4::Stream>(stream);
  Options o = c.options;
  o.sinks = &sinks.device_desc;
  try {
    fa4::forward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), &d_lse.desc(), o, {}, s);
    if (c.backward) {
      o.dsinks = &dsinks.device_desc;
      fa4::backward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), d_dout.desc(), d_lse.desc(), d_dq.desc(),
                    d_dk.desc(), d_dv.desc(), o, {}, s);
    }
  } catch (const fa4::Error& e) {
    ADD_FAILURE() << "threw: " << e.what();
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  d_out.copy_back(out);
  d_lse.copy_back(lse);

  // The references, on host copies of the sinks.
  Options host_options = c.options;
  host_options.sinks = &sinks.host_desc;
  const fa4::detail::Problem p = fa4::detail::validate_inputs("test", q.desc(), k.desc(), v.desc(), host_options);
  const double rtol = c.options.softcap > 0 ? 3.0 : 2.0;
  {
    auto out_ref = HostTensor::make(DType::f64, qshape), out_naive = HostTensor::make(DType::f64, qshape);
    auto lse_ref = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
    auto lse_naive = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
    fa4::cpu::reference_forward(p, q.desc(), k.desc(), v.desc(), out_ref.desc(), &lse_ref.desc(),
                                fa4::cpu::Precision::exact);
    fa4::cpu::reference_forward(p, q.desc(), k.desc(), v.desc(), out_naive.desc(), &lse_naive.desc(),
                                fa4::cpu::Precision::storage);
    const Comparison co = fa4::testing::compare(out.values(), out_ref.values(), out_naive.values(), c.dtype, rtol, 0.0);
    const Comparison cl = fa4::testing::compare(lse.values(), lse_ref.values(), lse_naive.values(), DType::f32, rtol, 0.0);
    EXPECT_TRUE(co.pass) << "out " << co.summary();
    EXPECT_TRUE(cl.pass) << "lse " << cl.summary();
    std::printf("  %-64s out %.3g/%.3g lse %.3g/%.3g%s\n", c.name().c_str(), co.max_error, co.bound, cl.max_error,
                cl.bound, co.pass && cl.pass ? "" : "  FAIL");
  }
  if (!c.backward) return;
  d_dq.copy_back(dq);
  d_dk.copy_back(dk);
  d_dv.copy_back(dv);
  const std::vector<float> got = dsinks.copy_back();

  auto dq_ref = HostTensor::make(DType::f64, qshape), dk_ref = HostTensor::make(DType::f64, kshape),
       dv_ref = HostTensor::make(DType::f64, kshape), dq_naive = HostTensor::make(DType::f64, qshape),
       dk_naive = HostTensor::make(DType::f64, kshape), dv_naive = HostTensor::make(DType::f64, kshape);
  std::vector<float> dsinks_ref(size_t(c.heads_q));
  fa4::Tensor dsinks_ref_t = sinks.host_desc;
  dsinks_ref_t.data = dsinks_ref.data();
  fa4::detail::Problem p_ref = p;
  p_ref.dsinks = &dsinks_ref_t;
  // dsinks_ref: the true gradient (from the exact O). dq, dk, dv: the gradients given the kernel's stored out, as
  // the backward is given it: with a sink, a row with one key has dP - D cancel, and out's rounding to the dtype
  // (the forward's error, checked above) would otherwise be most of the difference, in a handful of rows too few
  // for the naive baseline's max to bound reliably.
  fa4::cpu::reference_backward(p_ref, q.desc(), k.desc(), v.desc(), dout.desc(), dq_ref.desc(), dk_ref.desc(),
                               dv_ref.desc(), fa4::cpu::Precision::exact);
  fa4::cpu::reference_backward(p, q.desc(), k.desc(), v.desc(), dout.desc(), dq_ref.desc(), dk_ref.desc(),
                               dv_ref.desc(), fa4::cpu::Precision::exact, &out.desc());
  fa4::cpu::reference_backward(p, q.desc(), k.desc(), v.desc(), dout.desc(), dq_naive.desc(), dk_naive.desc(),
                               dv_naive.desc(), fa4::cpu::Precision::storage, &out.desc());
  const double atol = c.options.softcap > 0 ? 3e-4 : 0.0;
  const Comparison cq = fa4::testing::compare(dq.values(), dq_ref.values(), dq_naive.values(), c.dtype, rtol, atol);
  const Comparison ck = fa4::testing::compare(dk.values(), dk_ref.values(), dk_naive.values(), c.dtype, rtol, atol);
  const Comparison cv = fa4::testing::compare(dv.values(), dv_ref.values(), dv_naive.values(), c.dtype, rtol, atol);
  EXPECT_TRUE(cq.pass) << "dq " << cq.summary();
  EXPECT_TRUE(ck.pass) << "dk " << ck.summary();
  EXPECT_TRUE(cv.pass) << "dv " << cv.summary();

  // dsinks from the kernel's own out and lse, in fp64: own = -Σ exp(sink - lse) · Σ_c dO·O. own_bound covers the
  // kernel's fp32 sum of D (head_dim products) and its lse·log2e rounding; ref_bound adds out's rounding to the
  // dtype (each O element off by at most the roundoff), which is what separates own from the fp64 reference.
  const std::vector<double> ov = out.values(), gv = dout.values(), lv = lse.values();
  double worst_own = 0, worst_ref = 0;
  for (int64_t h = 0; h < c.heads_q; ++h) {
    const double sink = sinks.host[size_t(h)];
    double own = 0, own_bound = 0, ref_bound = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        const double row_lse = lv[size_t((b * c.heads_q + h) * c.seqlen_q + i)];
        if (row_lse == -INFINITY || sink == -INFINITY) continue;
        const double p_sink = std::exp(sink - row_lse);
        double d = 0, d_abs = 0;
        for (int64_t col = 0; col < c.head_dim; ++col) {
          const size_t e = size_t(((b * c.seqlen_q + i) * c.heads_q + h) * c.head_dim + col);
          d += gv[e] * ov[e];
          d_abs += std::fabs(gv[e] * ov[e]);
        }
        own -= p_sink * d;
        own_bound += p_sink * d_abs * 4e-5 * (1.0 + std::fabs(row_lse));
        ref_bound += p_sink * d_abs * 2.0 * roundoff(c.dtype);
      }
    const double g = got[size_t(h)];
    EXPECT_TRUE(std::isfinite(g)) << "dsinks[" << h << "] = " << g;
    EXPECT_LE(std::fabs(g - own), own_bound + 1e-30) << "dsinks[" << h << "] " << g << " vs own " << own;
    EXPECT_LE(std::fabs(g - dsinks_ref[size_t(h)]), own_bound + ref_bound + 1e-30)
        << "dsinks[" << h << "] " << g << " vs reference " << dsinks_ref[size_t(h)];
    worst_own = std::max(worst_own, std::fabs(g - own) / (own_bound + 1e-30));
    worst_ref = std::max(worst_ref, std::fabs(g - dsinks_ref[size_t(h)]) / (own_bound + ref_bound + 1e-30));
  }
  std::printf("  %-64s dq %.3g/%.3g dk %.3g/%.3g dv %.3g/%.3g dsinks err/bound own %.3g ref %.3g%s\n",
              c.name().c_str(), cq.max_error, cq.bound, ck.max_error, ck.bound, cv.max_error, cv.bound, worst_own,
              worst_ref, cq.pass && ck.pass && cv.pass ? "" : "  FAIL");
  std::fflush(stdout);
}

// Shapes: rows that see no key (causal with more queries than keys), no keys at all (out 0, lse = sink), no
// queries (dsinks 0), tails against every tile, and one long enough for several K/V tiles and rescales.
const Shape kShapes[] = {{77, 45}, {300, 513}, {129, 1000}, {64, 0}, {0, 77}, {1, 1}};

void sweep(bool backward) {
  uint64_t seed = backward ? 900 : 800;
  for (const auto& [dtype, head_dim] : compiled_instances(backward))
    for_each_sweep_case<SinkCase>(dtype, head_dim, kShapes, seed, [&](SinkCase& c, int) {
      c.backward = backward;
      check_sink_case(c);
    });
}

TEST(GpuSinksSm90, ForwardEveryInstance) {
  REQUIRE_SM90();
  sweep(false);
}

TEST(GpuSinksSm90, BackwardEveryInstance) {
  REQUIRE_SM90();
  sweep(true);
}

// Deterministic mode with sinks: dsinks (a fixed-order sum in every mode) and the gradients bitwise equal over
// repeated backward runs.
TEST(GpuSinksSm90, DeterministicBackwardIsBitwiseRepeatable) {
  REQUIRE_SM90();
  SinkCase c;
  c.batch = 2, c.seqlen_q = 700, c.seqlen_k = 900, c.heads_q = 6, c.heads_kv = 2, c.head_dim = 128;
  c.options.causal = true;
  c.options.deterministic = true;
  c.seed = 77;
  check_sink_case(c);  // correct first
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c.spec());
  const std::array<int64_t, 4> qshape{c.batch, c.seqlen_q, c.heads_q, c.head_dim};
  auto out = HostTensor::make(c.dtype, qshape), dq = HostTensor::make(c.dtype, qshape);
  auto dk = HostTensor::make(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim});
  auto dv = HostTensor::make(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim});
  auto lse = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  const size_t k_elems = size_t(in.kv_storage_elems);
  DeviceCopy d_q(in.q, size_t(in.q.numel())), d_k(in.k, k_elems), d_v(in.v, k_elems),
      d_dout(in.dout, size_t(in.dout.numel())), d_out(out, size_t(out.numel())), d_lse(lse, size_t(lse.numel())),
      d_dq(dq, size_t(dq.numel())), d_dk(dk, size_t(dk.numel())), d_dv(dv, size_t(dv.numel()));
  const SinkVector sinks(sink_values(c.heads_q, 1));
  SinkVector dsinks(std::vector<float>(size_t(c.heads_q), 0.0f));
  Options o = c.options;
  o.sinks = &sinks.device_desc;
  fa4::forward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), &d_lse.desc(), o);
  o.dsinks = &dsinks.device_desc;
  std::vector<float> first;
  HostTensor first_dq = HostTensor::make(c.dtype, qshape);
  for (int run = 0; run < 20; ++run) {
    CUDA_OK(cudaMemset(dsinks.device, 0xff, dsinks.host.size() * sizeof(float)));
    fa4::backward(d_q.desc(), d_k.desc(), d_v.desc(), d_out.desc(), d_dout.desc(), d_lse.desc(), d_dq.desc(),
                  d_dk.desc(), d_dv.desc(), o);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> now = dsinks.copy_back();
    d_dq.copy_back(dq);
    if (run == 0) {
      first = now;
      d_dq.copy_back(first_dq);
      continue;
    }
    EXPECT_EQ(0, std::memcmp(now.data(), first.data(), now.size() * sizeof(float))) << "run " << run;
    EXPECT_TRUE(dq.storage() == first_dq.storage()) << "run " << run;
  }
}

}  // namespace
