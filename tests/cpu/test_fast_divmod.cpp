// FastDivmod (src/cuda/fast_divmod.hpp), the paged producer's division by the page size: against `/` and `%`
// over every divisor a page size can be (multiples of 16 up to 4096, and every divisor up to 1024 besides), the
// numerators around each multiple and at the ends of the 31-bit range, and random ones.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/fast_divmod.hpp"

using fa4::cuda::FastDivmod;

namespace {

void expect_exact(uint32_t d, uint32_t n) {
  const FastDivmod f(d);
  ASSERT_EQ(f.div(n), n / d) << "n = " << n << ", d = " << d << " (multiplier " << f.multiplier << ", shift "
                             << f.shift << ")";
  ASSERT_EQ(f.mod(n), n % d) << "n = " << n << ", d = " << d;
}

std::vector<uint32_t> divisors() {
  std::vector<uint32_t> ds;
  for (uint32_t d = 1; d <= 1024; ++d) ds.push_back(d);
  for (uint32_t d = 1040; d <= 4096; d += 16) ds.push_back(d);
  for (uint32_t d : {65535u, 65536u, 65537u, 1u << 20, (1u << 30) + 3, (1u << 31) - 1}) ds.push_back(d);
  return ds;
}

}  // namespace

TEST(FastDivmod, MatchesDivisionNearEveryMultipleAndAtTheEnds) {
  constexpr uint32_t kMax = (1u << 31) - 1;
  for (uint32_t d : divisors()) {
    for (uint32_t q = 0; q <= 300; ++q)
      for (int64_t delta = -1; delta <= 1; ++delta) {
        const int64_t n = int64_t(q) * d + delta;
        if (n >= 0 && n <= kMax) expect_exact(d, uint32_t(n));
      }
    for (uint32_t n = kMax; n > kMax - 3 * d && n > kMax - 5000; --n) expect_exact(d, n);
    const uint32_t top = kMax / d * d;  // the largest multiple in range, and its neighbours
    for (int64_t n = int64_t(top) - 1; n <= int64_t(top) + 1 && n <= kMax; ++n) expect_exact(d, uint32_t(n));
  }
}

TEST(FastDivmod, MatchesDivisionOnRandomNumerators) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> numerator(0, (1u << 31) - 1);
  for (uint32_t d : divisors())
    for (int i = 0; i < 200; ++i) expect_exact(d, numerator(rng));
}

TEST(FastDivmod, DivisorOneAndPowersOfTwo) {
  for (uint32_t shift = 0; shift < 31; ++shift)
    for (uint32_t n : {0u, 1u, 12345u, (1u << 31) - 1}) expect_exact(1u << shift, n);
  EXPECT_EQ(FastDivmod(1).div(77), 77u);
  EXPECT_EQ(FastDivmod(64).shift, 6u);
}
