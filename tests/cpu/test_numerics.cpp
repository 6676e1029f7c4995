// exp2 emulation, conversions, mask predicates and the rescale rule: the shared numerics of src/numerics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "numerics/convert.hpp"
#include "numerics/exp2.hpp"
#include "numerics/mask.hpp"
#include "numerics/online_softmax.hpp"

using namespace fa4::num;

namespace {
uint32_t fbits(float f) { return bits_as<uint32_t>(f); }
}  // namespace

TEST(Exp2Emulation, CoefficientsAreFa4sPublishedWords) {
  EXPECT_EQ(fbits(kExp2C0), 0x3F800000u);
  EXPECT_EQ(fbits(kExp2C1), 0x3F31F519u);
  EXPECT_EQ(fbits(kExp2C2), 0x3E6906A4u);
  EXPECT_EQ(fbits(kExp2C3), 0x3D9DF09Du);
}

TEST(Exp2Emulation, RelativeErrorBelow1e4OverDenseSweep) {
  double worst = 0, worst_x = 0;
  for (int64_t i = 0; i <= 126 * 65536; ++i) {  // [-126, 0] in steps of 2^-16
    const float x = -static_cast<float>(i) / 65536.0f;
    const double exact = std::exp2(static_cast<double>(x));
    const double rel = std::fabs(exp2_emulated(x) - exact) / exact;
    if (rel > worst) worst = rel, worst_x = x;
  }
  EXPECT_LE(worst, 1e-4) << "at x = " << worst_x;
  EXPECT_GE(worst, 5e-5) << "the degree-3 fit should show its known ~8.8e-5 error; is the polynomial bypassed?";
}

TEST(Exp2Emulation, Bf16RoundedResultWithinOneUlpOfExact) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-126.0f, 0.0f);
  int identical = 0;
  const int n = 1 << 20;
  for (int i = 0; i < n; ++i) {
    const float x = dist(rng);
    const uint16_t emu = float_to_bf16_bits(exp2_emulated(x));
    const uint16_t exact = float_to_bf16_bits(static_cast<float>(std::exp2(static_cast<double>(x))));
    ASSERT_LE(std::abs(static_cast<int>(emu) - static_cast<int>(exact)), 1) << "x = " << x;
    identical += emu == exact;
  }
  EXPECT_GE(static_cast<double>(identical) / n, 0.98);  // FA4 reports 99% identical after bf16 rounding
}

TEST(Exp2Emulation, EdgeCases) {
  EXPECT_EQ(exp2_emulated(0.0f), 1.0f);
  EXPECT_EQ(exp2_emulated(-1.0f), 0.5f);
  EXPECT_EQ(exp2_emulated(-126.0f), std::ldexp(1.0f, -126));
  EXPECT_EQ(exp2_emulated(-126.5f), 0.0f);  // below the smallest normal: flushed, as on the GPU
  EXPECT_EQ(exp2_emulated(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(exp2_emulated(NAN)));
  EXPECT_NEAR(exp2_emulated(8.0f), 256.0f, 0.0f);  // stale max: x up to tau > 0
}

// The device's floor_split (x + 1.5·2^23 rounded toward -inf, then its bits) against the host's floorf, with the
// round-down sum modelled exactly here: t, the sum rounded to a float, is 1.5·2^23 plus an integer (the unit there
// is 1), and when that integer exceeds x (compared exactly in double) the rounded-down sum is the float below.
TEST(Exp2Emulation, DeviceFloorSplitIsTheHostsFloor) {
  auto device_model = [](float x) {
    float t = x + kFloorMagic;
    if (static_cast<double>(t) - static_cast<double>(kFloorMagic) > static_cast<double>(x))
      t = std::nextafter(t, -INFINITY);
    return FloorSplit{t - kFloorMagic, bits_as<int32_t>(t) - bits_as<int32_t>(kFloorMagic)};
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-127.0f, 127.0f);
  std::vector<float> xs;
  for (int i = 0; i < (1 << 20); ++i) xs.push_back(dist(rng));
  for (int k = -127; k <= 127; ++k)  // integers and their neighbours, where floor changes
    for (float x : {static_cast<float>(k), std::nextafter(static_cast<float>(k), -INFINITY),
                    std::nextafter(static_cast<float>(k), INFINITY)})
      xs.push_back(x);
  for (float x : {-0.0f, 1e-30f, -1e-30f, 4194303.5f, -4194304.0f}) xs.push_back(x);
  for (float x : xs) {
    const FloorSplit host = floor_split(x), dev = device_model(x);
    ASSERT_EQ(host.n, dev.n) << "x = " << x;  // as values: -0 floors to -0 here and to +0 there (f is then
                                              // +0 or -0, and the polynomial of either is the same bits)
    ASSERT_EQ(host.ni, dev.ni) << "x = " << x;
  }
}

TEST(Exp2Accurate, FullFp32AccuracyAndEdges) {
  double worst = 0;
  for (int64_t i = -126 * 4096; i <= 16 * 4096; ++i) {
    const float x = static_cast<float>(i) / 4096.0f + 1.0f / 8192.0f;
    const double exact = std::exp2(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp2_accurate(x) - exact) / exact);
  }
  EXPECT_LE(worst, 3e-7);
  EXPECT_EQ(exp2_accurate(0.0f), 1.0f);
  EXPECT_EQ(exp2_accurate(-INFINITY), 0.0f);
  EXPECT_EQ(exp2_accurate(200.0f), INFINITY);
  EXPECT_TRUE(std::isnan(exp2_accurate(NAN)));
}

TEST(Exp2Policy, FractionSelectsWholeEightColumnGroups) {
  for (int per16 : {0, 1, 4, 6, 16}) {
    int emulated = 0;
    for (int64_t j = 0; j < 1024; ++j) {
      emulated += exp2_is_emulated(j, per16);
      EXPECT_EQ(exp2_is_emulated(j, per16), exp2_is_emulated(j & ~int64_t{7}, per16));
    }
    EXPECT_EQ(emulated, 1024 * per16 / 16);
  }
}

TEST(Convert, Fp16MatchesCompilerConversionOnRandomAndSpecialFloats) {
  std::mt19937 rng(3);
  std::vector<float> xs = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.9802322e-8f, 5.9604645e-8f,
                           6.1035156e-5f, 6.0975552e-5f, INFINITY, -INFINITY, 1.0009765625f + 0.00048828125f};
  for (int i = 0; i < 1 << 20; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    xs.push_back(f);
    xs.push_back(std::ldexp(static_cast<float>(rng() % 4096) / 4096.0f, static_cast<int>(rng() % 40) - 25));
  }
  for (float f : xs) {
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(float_to_f16_bits(f), hb) << "f = " << f;
    ASSERT_EQ(fbits(f16_bits_to_float(hb)), fbits(static_cast<float>(h))) << "h = " << hb;
  }
  EXPECT_TRUE(std::isnan(f16_bits_to_float(float_to_f16_bits(NAN))));
}

TEST(Convert, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(bits_as<float>(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(float_to_bf16_bits(bits_as<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16_bits(bits_as<float>(0x3F808001u)), 0x3F81);  // above the tie
  EXPECT_EQ(float_to_bf16_bits(bits_as<float>(0x7F7FFFFFu)), 0x7F80);  // FLT_MAX rounds to inf
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(NAN))));
  std::mt19937 rng(5);
  for (int i = 0; i < 1 << 20; ++i) {  // against a double-based RNE to 8 significant bits
    const float f = std::ldexp(static_cast<float>(rng() % (1 << 24)) / (1 << 24), static_cast<int>(rng() % 60) - 30);
    if (f == 0.0f) continue;
    int e;
    std::frexp(static_cast<double>(f), &e);
    const double q = std::ldexp(1.0, e - 8);
    const double want = std::nearbyint(static_cast<double>(f) / q) * q;  // default mode: ties to even
    ASSERT_EQ(static_cast<double>(bf16_bits_to_float(float_to_bf16_bits(f))), want) << f;
  }
}

TEST(Mask, CausalIsBottomRightAligned) {
  const Mask m = Mask::make(3, 5, true, -1, -1);  // offset 2: row i sees keys <= i + 2
  EXPECT_EQ(m.key_end(0), 3);
  EXPECT_EQ(m.key_end(2), 5);
  EXPECT_TRUE(m.visible(0, 2));
  EXPECT_FALSE(m.visible(0, 3));
  const Mask tall = Mask::make(5, 2, true, -1, -1);  // offset -3: rows 0..2 see nothing
  EXPECT_EQ(tall.key_end(2), 0);
  EXPECT_EQ(tall.key_end(3), 1);
  EXPECT_EQ(tall.key_end(4), 2);
}

TEST(Mask, WindowBounds) {
  const Mask m = Mask::make(10, 10, false, 2, 1);
  EXPECT_EQ(m.key_begin(5), 3);
  EXPECT_EQ(m.key_end(5), 7);
  EXPECT_EQ(m.key_begin(0), 0);
  EXPECT_EQ(m.key_end(9), 10);
  const Mask c = Mask::make(4, 8, true, 1, -1);  // causal + left window, offset 4
  EXPECT_EQ(c.key_begin(0), 3);
  EXPECT_EQ(c.key_end(0), 5);
}

// The rescale rule on a stream of score blocks: same normalised result as always-rescaling, and no
// accumulated P ever exceeds 2^tau.
TEST(OnlineSoftmax, ConditionalRescaleMatchesAlwaysRescaleAndBoundsP) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(512);
    for (size_t j = 0; j < x.size(); ++j) x[j] = dist(rng) + 0.05f * static_cast<float>(j);  // rising maxima
    for (float tau : {0.0f, 8.0f}) {
      float m = -INFINITY, l = 0, o = 0;  // o: a 1-wide "output" accumulating value v_j = cos(j)
      int rescales = 0;
      for (size_t j0 = 0; j0 < x.size(); j0 += 64) {
        float bm = -INFINITY;
        for (size_t j = j0; j < j0 + 64; ++j) bm = std::max(bm, x[j]);
        const RowMaxUpdate u = update_row_max(m, bm, tau);
        if (u.rescaled) {
          const float f = exp2_accurate(u.log2_scale);
          l *= f, o *= f, ++rescales;
        }
        m = u.m;
        for (size_t j = j0; j < j0 + 64; ++j) {
          const float p = exp2_accurate(x[j] - safe_max(m));
          ASSERT_LE(p, std::exp2(tau) * (1 + 1e-6f));
          l += p;
          o += p * std::cos(static_cast<float>(j));
        }
      }
      double ml = -INFINITY, ll = 0, oo = 0;
      for (float xi : x) ml = std::max<double>(ml, xi);
      for (size_t j = 0; j < x.size(); ++j) {
        const double p = std::exp2(x[j] - ml);
        ll += p, oo += p * std::cos(static_cast<double>(static_cast<float>(j)));
      }
      const RowFinal fin = finalize_row(m, l);
      EXPECT_NEAR(o * fin.inv_l, oo / ll, 2e-5) << "tau " << tau;
      EXPECT_NEAR(fin.lse, (ml + std::log2(ll)) * std::log(2.0), 1e-4);
      if (tau == 0.0f) {
        EXPECT_GT(rescales, 0);
      }
    }
  }
}

TEST(OnlineSoftmax, FullyMaskedRowGivesZeroAndMinusInf) {
  const RowMaxUpdate u = update_row_max(-INFINITY, -INFINITY, 8.0f);
  EXPECT_EQ(u.m, -INFINITY);
  EXPECT_EQ(exp2_accurate(-INFINITY - safe_max(u.m)), 0.0f);
  const RowFinal fin = finalize_row(u.m, 0.0f);
  EXPECT_EQ(fin.inv_l, 0.0f);
  EXPECT_EQ(fin.lse, -INFINITY);
}
