// Attention sinks (Options::sinks, Options::dsinks) on the CPU backend: the fp64 reference checked against an
// independent identity (a sink is a key of value zero: lse = logaddexp(lse without it, sink), out scaled by
// exp(lse without - lse with)); the backend's outputs and gradients against that reference with the tolerance
// rule over masks, dtypes, GQA and fully masked rows; dsinks against finite differences of the fp64 path and
// against the reference; variable-length batches summing dsinks over their sequences; each bad argument
// refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "testing/tolerance.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::Tensor;
using fa4::testing::CaseSpec;
using fa4::testing::HostTensor;

// An fp32 [n] tensor in host memory.
struct Vector {
  std::vector<float> data;
  Tensor desc;
  explicit Vector(std::vector<float> values) : data(std::move(values)) {
    desc.data = data.data();
    desc.dtype = DType::f32;
    desc.rank = 1;
    desc.shape = {int64_t(data.size()), 0, 0, 0};
    desc.stride = {1, 0, 0, 0};
  }
  Vector(const Vector&) = delete;
  Vector& operator=(const Vector&) = delete;
};

// Sinks of every kind: small, dominant (the sink outweighs the keys), very negative (no effect), and -inf.
std::vector<float> sink_values(int64_t heads) {
  const float kinds[] = {0.7f, 6.0f, -30.0f, -std::numeric_limits<float>::infinity(), -1.3f, 2.5f};
  std::vector<float> v;
  for (int64_t h = 0; h < heads; ++h) v.push_back(kinds[h % 6]);
  return v;
}

TEST(Sinks, BackendMatchesTheReferenceWithTheToleranceRule) {
  struct Mask {
    bool causal;
    int64_t left, right;
  };
  uint64_t seed = 300;
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    for (Mask m : {Mask{false, -1, -1}, Mask{true, -1, -1}, Mask{false, 20, 3}}) {
      CaseSpec c;
      c.dtype = dtype;
      c.batch = 2, c.seqlen_q = 77, c.seqlen_k = 45, c.heads_q = 6, c.heads_kv = 2, c.head_dim = 64;
      c.options.causal = m.causal, c.options.window_left = m.left, c.options.window_right = m.right;
      const Vector sinks(sink_values(c.heads_q));
      c.options.sinks = &sinks.desc;
      c.seed = ++seed;
      const fa4::testing::CaseResult r = fa4::testing::run_case(c);
      EXPECT_TRUE(r.pass) << c.name() << ": " << r.failure;
    }
}

// The reference against the definition, independently: with a sink, lse = logaddexp(lse0, sink) and
// out = out0 · exp(lse0 − lse); a row that sees no key has out = 0 and lse = sink.
TEST(Sinks, ReferenceEqualsAKeyOfValueZero) {
  CaseSpec c;
  c.dtype = DType::f64;
  c.batch = 1, c.seqlen_q = 40, c.seqlen_k = 24, c.heads_q = 4, c.heads_kv = 4, c.head_dim = 32;
  c.options.causal = true;  // rows 0 .. 15 see no key
  c.seed = 17;
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c);
  const Vector sinks(sink_values(c.heads_q));
  auto out0 = HostTensor::make(DType::f64, {1, 40, 4, 32}), out = HostTensor::make(DType::f64, {1, 40, 4, 32});
  auto lse0 = HostTensor::make_lse({1, 4, 40}), lse = HostTensor::make_lse({1, 4, 40});
  Options with = c.options;
  with.sinks = &sinks.desc;
  const auto p0 = fa4::detail::validate_inputs("test", in.q.desc(), in.k.desc(), in.v.desc(), c.options);
  const auto p1 = fa4::detail::validate_inputs("test", in.q.desc(), in.k.desc(), in.v.desc(), with);
  fa4::cpu::reference_forward(p0, in.q.desc(), in.k.desc(), in.v.desc(), out0.desc(), &lse0.desc());
  fa4::cpu::reference_forward(p1, in.q.desc(), in.k.desc(), in.v.desc(), out.desc(), &lse.desc());
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < 40; ++i) {
      const double s = sinks.data[size_t(h)], l0 = lse0.at({0, h, i, 0}), l1 = lse.at({0, h, i, 0});
      const double expect = l0 == -INFINITY ? s : (s == -INFINITY ? l0 : std::max(l0, s) + std::log1p(std::exp(-std::fabs(l0 - s))));
      if (expect == -INFINITY) {
        EXPECT_EQ(l1, -INFINITY) << "h " << h << " row " << i;
      } else {
        EXPECT_NEAR(l1, expect, 2e-6 * std::max(1.0, std::fabs(expect))) << "h " << h << " row " << i;
      }
      for (int64_t e = 0; e < 32; ++e) {
        const double o0 = out0.at({0, i, h, e}), o1 = out.at({0, i, h, e});
        const double want = l0 == -INFINITY ? 0.0 : o0 * std::exp(l0 - double(l1));
        EXPECT_NEAR(o1, want, 1e-5 * std::max(1.0, std::fabs(want))) << "h " << h << " row " << i << " col " << e;
      }
    }
}

// Runs forward and backward on the public API and returns dsinks and L = sum(dout · out).
struct SinkRun {
  std::vector<float> dsinks;
  double loss = 0;
};
SinkRun run_with_sinks(const CaseSpec& c, fa4::testing::CaseInputs& in, const std::vector<float>& sink_vals,
                       bool with_backward) {
  const int64_t hq = c.heads_q;
  auto out = HostTensor::make(c.dtype, {c.batch, c.seqlen_q, hq, c.head_dim});
  auto lse = HostTensor::make_lse({c.batch, hq, c.seqlen_q});
  auto dq = HostTensor::make(c.dtype, {c.batch, c.seqlen_q, hq, c.head_dim});
  auto dk = HostTensor::make(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim});
  auto dv = HostTensor::make(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim});
  for (auto* t : {&out, &lse, &dq, &dk, &dv}) t->poison();
  const Vector sinks(sink_vals);
  Vector dsinks(std::vector<float>(size_t(hq), std::numeric_limits<float>::quiet_NaN()));
  Options o = c.options;
  o.sinks = &sinks.desc;
  fa4::forward(in.q.desc(), in.k.desc(), in.v.desc(), out.desc(), &lse.desc(), o);
  SinkRun r;
  const std::vector<double> ov = out.values(), dov = in.dout.values();
  for (size_t i = 0; i < ov.size(); ++i) r.loss += ov[i] * dov[i];
  if (with_backward) {
    o.dsinks = &dsinks.desc;
    fa4::backward(in.q.desc(), in.k.desc(), in.v.desc(), out.desc(), in.dout.desc(), lse.desc(), dq.desc(), dk.desc(),
                  dv.desc(), o);
    r.dsinks = dsinks.data;
  }
  return r;
}

// dL/dsink by central differences of the fp64 path (the CPU backend computes f64 exactly).
TEST(Sinks, GradientMatchesFiniteDifferences) {
  CaseSpec c;
  c.dtype = DType::f64;
  c.batch = 2, c.seqlen_q = 30, c.seqlen_k = 20, c.heads_q = 4, c.heads_kv = 2, c.head_dim = 16;
  c.options.causal = true;
  c.seed = 23;
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c);
  const std::vector<float> base = {0.5f, 3.0f, -2.0f, 1.25f};
  const SinkRun grad = run_with_sinks(c, in, base, true);
  for (size_t h = 0; h < base.size(); ++h) {
    const float eps = 1.0f / 256;  // exact in fp32, so both sinks are what the difference assumes
    std::vector<float> up = base, down = base;
    up[h] += eps, down[h] -= eps;
    const double fd = (run_with_sinks(c, in, up, false).loss - run_with_sinks(c, in, down, false).loss) / (2.0 * eps);
    EXPECT_NEAR(grad.dsinks[h], fd, 1e-4 * std::max(1.0, std::fabs(fd))) << "head " << h;
    EXPECT_NE(grad.dsinks[h], 0.0f) << "head " << h << ": a gradient that cannot be zero here";
  }
}

// The blocked bf16/f32 backward's dsinks against the exact reference, with the tolerance rule's baseline (the
// same-precision reference); causal with more queries than keys, so rows 0..19 see no key, and one sink of -inf
// (no sink: those rows then have LSE = -inf and must add nothing, not NaN).
TEST(Sinks, BackendGradientMatchesTheReference) {
  for (DType dtype : {DType::bf16, DType::f32}) {
    CaseSpec c;
    c.dtype = dtype;
    c.batch = 3, c.seqlen_q = 150, c.seqlen_k = 130, c.heads_q = 4, c.heads_kv = 1, c.head_dim = 64;
    c.options.causal = true;
    c.seed = 41 + uint64_t(dtype);
    fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c);
    const std::vector<float> vals = {0.5f, 4.0f, -std::numeric_limits<float>::infinity(), 2.0f};
    const SinkRun got = run_with_sinks(c, in, vals, true);

    const Vector sinks(vals);
    Vector exact(std::vector<float>(4, 0.0f)), naive(std::vector<float>(4, 0.0f));
    Options o = c.options;
    o.sinks = &sinks.desc;
    std::vector<double> results[2];
    for (int which = 0; which < 2; ++which) {
      o.dsinks = which == 0 ? &exact.desc : &naive.desc;
      const auto p = fa4::detail::validate_inputs("test", in.q.desc(), in.k.desc(), in.v.desc(), o);
      auto dq = HostTensor::make(DType::f64, {3, 150, 4, 64});
      auto dk = HostTensor::make(DType::f64, {3, 130, 1, 64}), dv = HostTensor::make(DType::f64, {3, 130, 1, 64});
      fa4::cpu::reference_backward(p, in.q.desc(), in.k.desc(), in.v.desc(), in.dout.desc(), dq.desc(), dk.desc(),
                                   dv.desc(), which == 0 ? fa4::cpu::Precision::exact : fa4::cpu::Precision::storage);
    }
    const std::vector<double> ours(got.dsinks.begin(), got.dsinks.end()), ref(exact.data.begin(), exact.data.end()),
        base(naive.data.begin(), naive.data.end());
    const fa4::testing::Comparison cmp = fa4::testing::compare(ours, ref, base, DType::f32, 2.0, 0.0);
    EXPECT_TRUE(cmp.pass) << fa4::to_string(dtype) << ": dsinks " << cmp.summary();
    EXPECT_EQ(got.dsinks[2], 0.0f) << "a sink of -inf has no gradient";
  }
}

// The reference backward handed a stored output takes D from it: given the exact output it reproduces the
// recomputed gradient, and given a perturbed one it moves dq by exactly the perturbation's effect on D.
TEST(Sinks, ReferenceBackwardTakesDFromAGivenOutput) {
  CaseSpec c;
  c.dtype = DType::f32;
  c.batch = 1, c.seqlen_q = 5, c.seqlen_k = 1, c.heads_q = 2, c.heads_kv = 1, c.head_dim = 8;
  c.seed = 12;
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c);
  const Vector sinks({-2.0f, 1.0f});
  Options o = c.options;
  o.sinks = &sinks.desc;
  const auto p = fa4::detail::validate_inputs("test", in.q.desc(), in.k.desc(), in.v.desc(), o);
  const std::array<int64_t, 4> qshape{1, 5, 2, 8}, kshape{1, 1, 1, 8};
  auto out = HostTensor::make(DType::f64, qshape);
  fa4::cpu::reference_forward(p, in.q.desc(), in.k.desc(), in.v.desc(), out.desc(), nullptr);
  auto dq = HostTensor::make(DType::f64, qshape), dq_given = HostTensor::make(DType::f64, qshape);
  auto dk = HostTensor::make(DType::f64, kshape), dv = HostTensor::make(DType::f64, kshape);
  fa4::cpu::reference_backward(p, in.q.desc(), in.k.desc(), in.v.desc(), in.dout.desc(), dq.desc(), dk.desc(),
                               dv.desc());
  fa4::cpu::reference_backward(p, in.q.desc(), in.k.desc(), in.v.desc(), in.dout.desc(), dq_given.desc(), dk.desc(),
                               dv.desc(), fa4::cpu::Precision::exact, &out.desc());
  const std::vector<double> a = dq.values(), b = dq_given.values();
  for (size_t e = 0; e < a.size(); ++e) EXPECT_NEAR(a[e], b[e], 1e-12 * (1 + std::fabs(a[e]))) << e;
  // O[0, 0, 0, 0] += 1 changes D of row (0, head 0) by dO[0, 0, 0, 0]: dq of that row moves by
  // -P·ΔD·k·scale with P the row's lone key's probability, and no other row moves.
  static_cast<double*>(out.desc().data)[0] += 1.0;
  fa4::cpu::reference_backward(p, in.q.desc(), in.k.desc(), in.v.desc(), in.dout.desc(), dq_given.desc(), dk.desc(),
                               dv.desc(), fa4::cpu::Precision::exact, &out.desc());
  const std::vector<double> moved = dq_given.values(), qv = in.q.values(), kv = in.k.values(), gv = in.dout.values();
  double s = 0;
  for (int c2 = 0; c2 < 8; ++c2) s += qv[size_t(c2)] * kv[size_t(c2)];
  s *= p.scale;
  const double prob = 1.0 / (1.0 + std::exp(-2.0 - s));
  for (int c2 = 0; c2 < 8; ++c2)
    EXPECT_NEAR(moved[size_t(c2)] - a[size_t(c2)], -prob * gv[0] * kv[size_t(c2)] * p.scale, 1e-9) << c2;
  for (size_t e = 8; e < a.size(); ++e) EXPECT_NEAR(moved[e], a[e], 1e-12 * (1 + std::fabs(a[e]))) << e;
}

// Variable-length batches: the forward takes the sinks per sequence and the backward sums dsinks over them.
TEST(Sinks, VarlenSumsTheGradientOverSequences) {
  const int64_t hq = 2, d = 32;
  const int64_t lens[] = {13, 0, 21};
  CaseSpec c;
  c.dtype = DType::f32;
  c.batch = 1, c.seqlen_q = 34, c.seqlen_k = 34, c.heads_q = hq, c.heads_kv = hq, c.head_dim = d;
  c.seed = 5;
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c);  // one packed batch of 34 rows
  const auto as_packed = [](const HostTensor& t) {
    Tensor p = t.desc();
    p.rank = 3;
    p.shape = {t.desc().shape[1], t.desc().shape[2], t.desc().shape[3], 1};
    p.stride = {t.desc().stride[1], t.desc().stride[2], t.desc().stride[3], 1};
    return p;
  };
  auto out = HostTensor::make(DType::f32, {1, 34, hq, d}), dq = HostTensor::make(DType::f32, {1, 34, hq, d});
  auto dk = HostTensor::make(DType::f32, {1, 34, hq, d}), dv = HostTensor::make(DType::f32, {1, 34, hq, d});
  std::vector<float> lse_data(size_t(hq * 34));
  Tensor lse;
  lse.data = lse_data.data(), lse.dtype = DType::f32, lse.rank = 2, lse.shape = {hq, 34, 0, 0}, lse.stride = {34, 1, 0, 0};
  const Vector sinks({1.5f, -0.5f});
  Vector dsinks(std::vector<float>(size_t(hq), std::numeric_limits<float>::quiet_NaN()));
  std::vector<int32_t> cu{0};
  for (int64_t n : lens) cu.push_back(cu.back() + int32_t(n));
  fa4::Varlen vl;
  vl.cu_seqlens_q = vl.cu_seqlens_k = cu.data();
  vl.batch = 3, vl.max_seqlen_q = vl.max_seqlen_k = 21;
  Options o;
  o.sinks = &sinks.desc;
  fa4::forward_varlen(as_packed(in.q), as_packed(in.k), as_packed(in.v), as_packed(out), &lse, vl, o);
  o.dsinks = &dsinks.desc;
  fa4::backward_varlen(as_packed(in.q), as_packed(in.k), as_packed(in.v), as_packed(out), as_packed(in.dout), lse,
                       as_packed(dq), as_packed(dk), as_packed(dv), vl, o);
  // The same sum from the definition: -sum over every packed row of exp(sink - lse) · rowsum(dout · out).
  for (int64_t h = 0; h < hq; ++h) {
    double want = 0;
    for (int64_t r = 0; r < 34; ++r) {
      double dsum = 0;
      for (int64_t e = 0; e < d; ++e) dsum += in.dout.at({0, r, h, e}) * out.at({0, r, h, e});
      want -= std::exp(double(sinks.data[size_t(h)]) - double(lse_data[size_t(h * 34 + r)])) * dsum;
    }
    EXPECT_NEAR(dsinks.data[size_t(h)], want, 1e-5 * std::max(1.0, std::fabs(want))) << "head " << h;
  }
}

TEST(Sinks, BadArgumentsAreRefusedByName) {
  CaseSpec c;
  c.batch = 1, c.seqlen_q = 8, c.seqlen_k = 8, c.heads_q = 2, c.heads_kv = 2, c.head_dim = 16;
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c);
  auto out = HostTensor::make(DType::f32, {1, 8, 2, 16});
  const Vector good({0.0f, 1.0f}), three({0.0f, 1.0f, 2.0f});
  Vector grad({0.0f, 0.0f});
  auto refused = [&](const Options& o, const std::string& needle) {
    try {
      fa4::forward(in.q.desc(), in.k.desc(), in.v.desc(), out.desc(), nullptr, o);
      ADD_FAILURE() << "accepted; expected an error naming " << needle;
    } catch (const fa4::Error& e) {
      EXPECT_EQ(e.code(), fa4::Status::invalid_argument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fa4::supports(fa4::Pass::forward, in.q.desc(), in.k.desc(), in.v.desc(), o).ok);
  };
  Options o;
  o.sinks = &three.desc;
  refused(o, "'options.sinks': expected shape [2]");
  Tensor f16 = good.desc;
  f16.dtype = DType::f16;
  o.sinks = &f16;
  refused(o, "'options.sinks': expected dtype f32");
  o.sinks = nullptr;
  o.dsinks = &grad.desc;
  refused(o, "'options.dsinks': expected null unless options.sinks");
  o.sinks = &good.desc;
  refused(o, "'options.dsinks': expected null (only the backward");
  EXPECT_TRUE(fa4::supports(fa4::Pass::backward, in.q.desc(), in.k.desc(), in.v.desc(), o).ok);
}

}  // namespace
