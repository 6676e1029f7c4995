// The CPU backend against the fp64 reference with FlashAttention's tolerance rule (DESIGN.md §4), forward
// and backward, on fresh random inputs with NaN-poisoned outputs (testing::run_case).
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/amx.hpp"
#include "testing/tolerance.hpp"

namespace fa4::testing {
// gtest prints parameters through this (otherwise as raw bytes).
void PrintTo(const CaseSpec& c, std::ostream* os) { *os << c.name(); }
}  // namespace fa4::testing

using fa4::DType;
using fa4::testing::CaseSpec;
using fa4::testing::Layout;

namespace {

void expect_pass(const CaseSpec& c) {
  const auto r = fa4::testing::run_case(c);
  EXPECT_TRUE(r.pass) << c.name() << ": " << r.failure;
}

std::vector<CaseSpec> sweep() {
  std::vector<CaseSpec> cases;
  struct Shape { int64_t sq, sk; };
  const Shape shapes[] = {{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {1023, 1024}, {64, 128}, {128, 65}};
  const std::pair<int64_t, int64_t> heads[] = {{4, 4}, {4, 2}, {4, 1}};  // MHA, GQA, MQA
  const int64_t dims[] = {64, 128, 40, 96, 256, 8, 111};
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const Shape& s : shapes)
      for (int mask = 0; mask < 3; ++mask) {
        CaseSpec c;
        c.dtype = dt;
        c.seqlen_q = s.sq, c.seqlen_k = s.sk;
        c.batch = s.sq * s.sk > 100000 ? 1 : 2;
        c.heads_q = heads[seed % 3].first, c.heads_kv = heads[seed % 3].second;
        c.head_dim = dims[seed % 7];
        if (s.sq * s.sk > 100000 && c.head_dim > 128) c.head_dim = 64;
        c.options.causal = mask == 1;
        if (mask == 2) c.options.window_left = 19 + static_cast<int64_t>(seed % 50), c.options.window_right = static_cast<int64_t>(seed % 9);
        c.seed = seed++;
        cases.push_back(c);
      }
  return cases;
}

}  // namespace

class CpuBackendSweep : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuBackendSweep, ForwardAndBackwardWithinToleranceRule) { expect_pass(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Shapes, CpuBackendSweep, ::testing::ValuesIn(sweep()), [](const auto& info) {
  std::string n = info.param.name();
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n + "_" + std::to_string(info.index);
});

static CaseSpec base(DType dt = DType::bf16) {
  CaseSpec c;
  c.dtype = dt;
  c.batch = 2, c.seqlen_q = 150, c.seqlen_k = 230, c.heads_q = 6, c.heads_kv = 2, c.head_dim = 64, c.seed = 7;
  return c;
}

TEST(CpuBackend, Softcap) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    CaseSpec c = base(dt);
    c.options.softcap = 15.0f;
    expect_pass(c);
    c.options.causal = true;
    expect_pass(c);
  }
}

TEST(CpuBackend, Exp2EmulationPolicies) {
  for (float frac : {0.125f, 0.25f, 0.5f, 1.0f})
    for (DType dt : {DType::bf16, DType::f16}) {
      CaseSpec c = base(dt);
      c.options.exp2_emulated_fraction = frac;
      c.options.causal = frac == 0.25f;
      expect_pass(c);
    }
}

TEST(CpuBackend, ConditionalRescaleAndAlwaysRescaleBothPass) {
  for (float tau : {0.0f, 4.0f, 8.0f, 15.0f}) {
    CaseSpec c = base(DType::f32);
    c.seqlen_q = c.seqlen_k = 500;  // many kv blocks, so the max moves
    c.options.rescale_threshold = tau;
    expect_pass(c);
  }
}

TEST(CpuBackend, StridedLayoutsAndBroadcastKv) {
  CaseSpec c = base();
  c.layout = Layout::bhsd;
  expect_pass(c);
  c.layout = Layout::bshd;
  c.broadcast_kv = true;  // K/V heads as a stride-0 view of one head
  expect_pass(c);
}

TEST(CpuBackend, LongSequence4224CausalForward) {
  CaseSpec c = base();
  c.batch = 1, c.heads_q = 1, c.heads_kv = 1, c.seqlen_q = c.seqlen_k = 4224, c.head_dim = 64;
  c.options.causal = true;
  c.backward = false;
  expect_pass(c);
}

TEST(CpuBackend, DegenerateSizes) {
  for (auto [b, sq, sk] : {std::tuple{2, 5, 0}, std::tuple{2, 0, 5}, std::tuple{0, 5, 5}, std::tuple{1, 1, 1}}) {
    CaseSpec c = base(DType::f32);
    c.batch = b, c.seqlen_q = sq, c.seqlen_k = sk;
    expect_pass(c);  // seqlen_k = 0: O = 0, LSE = -inf, zero gradients
  }
}

TEST(CpuBackend, Fp64IsComputedExactly) {
  CaseSpec c = base(DType::f64);
  c.options.causal = true;
  const auto r = fa4::testing::run_case(c);
  EXPECT_TRUE(r.pass) << r.failure;
  EXPECT_LT(r.out.max_error, 1e-12);
  EXPECT_LT(r.dq.max_error, 1e-12);
}

// bf16 runs on AMX tiles where the CPU has them; the fp32 vector path must stay correct for bf16 too.
TEST(CpuBackend, Bf16OnBothProductPaths) {
  for (bool amx_on : {false, true}) {
    fa4::cpu::amx::set_enabled(amx_on);
    for (int64_t d : {40, 64, 128, 256}) {
      CaseSpec c = base(DType::bf16);
      c.head_dim = d;
      c.options.causal = d == 64;
      c.options.softcap = d == 40 ? 20.0f : 0.0f;
      expect_pass(c);
    }
  }
  fa4::cpu::amx::set_enabled(true);
}

// Rows that see no key (causal with seqlen_q > seqlen_k): O exactly 0, LSE exactly -inf, gradients exactly
// 0 and finite, on both product paths.
TEST(CpuBackend, FullyMaskedRowsGiveZeroOutputMinusInfLseAndZeroGradients) {
  using fa4::testing::HostTensor;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (bool amx_on : {false, true}) {
      fa4::cpu::amx::set_enabled(amx_on);
      const int64_t sq = 70, sk = 5, h = 2, d = 64;  // offset -65: rows 0..64 see nothing
      auto q = HostTensor::make(dt, {1, sq, h, d}), k = HostTensor::make(dt, {1, sk, h, d}), v = HostTensor::make(dt, {1, sk, h, d});
      auto out = HostTensor::make(dt, {1, sq, h, d}), dout = HostTensor::make(dt, {1, sq, h, d});
      auto dq = HostTensor::make(dt, {1, sq, h, d}), dk = HostTensor::make(dt, {1, sk, h, d}), dv = HostTensor::make(dt, {1, sk, h, d});
      auto lse = HostTensor::make_lse({1, h, sq});
      q.fill_normal(1), k.fill_normal(2), v.fill_normal(3), dout.fill_normal(4);
      for (auto* t : {&out, &lse, &dq, &dk, &dv}) t->poison();
      fa4::Options o;
      o.causal = true;
      fa4::forward(q.desc(), k.desc(), v.desc(), out.desc(), &lse.desc(), o);
      fa4::backward(q.desc(), k.desc(), v.desc(), out.desc(), dout.desc(), lse.desc(), dq.desc(), dk.desc(), dv.desc(), o);
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t i = 0; i < sq; ++i) {
          const bool masked = i < sq - sk;
          ASSERT_EQ(lse.at({0, hh, i, 0}) == -INFINITY, masked) << i;
          for (int64_t c = 0; c < d; ++c) {
            ASSERT_TRUE(std::isfinite(out.at({0, i, hh, c})) && std::isfinite(dq.at({0, i, hh, c})));
            if (masked) {
              ASSERT_EQ(out.at({0, i, hh, c}), 0.0);
              ASSERT_EQ(dq.at({0, i, hh, c}), 0.0);
            }
          }
        }
      for (double x : dk.values()) ASSERT_TRUE(std::isfinite(x));
      for (double x : dv.values()) ASSERT_TRUE(std::isfinite(x));
    }
  }
  fa4::cpu::amx::set_enabled(true);
}
