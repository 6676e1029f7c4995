// GPU tests. Without a GPU every test is skipped and the binary exits with ctest's skip code (77) after a
// visible SKIPPED line; on a GPU, a run that executes no test fails.
//
// Numerics: the exp2 emulation and the bf16/fp16 conversions are one source (src/numerics) compiled for
// host and device; their device results must be bitwise the host's, which is what lets the CPU backend
// reproduce emulated GPU elements exactly.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "api/device_info.hpp"
#include "cuda/numerics_probe.hpp"
#include "numerics/convert.hpp"
#include "numerics/exp2.hpp"

namespace {

std::vector<float> probe_inputs() {
  std::vector<float> x;
  for (int64_t i = -127 * 4096; i <= 16 * 4096; ++i) x.push_back(static_cast<float>(i) / 4096.0f + 1.0f / 65536.0f);
  std::mt19937 rng(1);
  for (int i = 0; i < 1 << 20; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  for (float s : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -126.0f, -126.5f, 65504.0f, 65520.0f}) x.push_back(s);
  return x;
}

}  // namespace

TEST(GpuNumerics, Exp2EmulationIsBitwiseTheHosts) {
  const auto x = probe_inputs();
  std::vector<float> dev(x.size());
  fa4::cuda::exp2_emulated_on_device(x.data(), dev.data(), x.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > 127.0f) continue;  // outside the documented domain
    const float host = fa4::num::exp2_emulated(x[i]);
    if (std::memcmp(&host, &dev[i], 4) != 0 && !(host != host && dev[i] != dev[i])) {
      if (++mismatches < 5) ADD_FAILURE() << "x = " << x[i] << ": host " << host << ", device " << dev[i];
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(GpuNumerics, ConversionsAreBitwiseTheHosts) {
  const auto x = probe_inputs();
  std::vector<uint16_t> bf(x.size()), hf(x.size());
  fa4::cuda::convert_on_device(x.data(), bf.data(), hf.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(bf[i], fa4::num::float_to_bf16_bits(x[i])) << x[i];
    ASSERT_EQ(hf[i], fa4::num::float_to_f16_bits(x[i])) << x[i];
  }
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const auto gpus = fa4::detail::cuda_devices();
  if (gpus.empty()) {
    std::printf("SKIPPED: fa4 GPU tests: no CUDA device visible (%d tests not run)\n",
                ::testing::UnitTest::GetInstance()->total_test_count());
    return 77;
  }
  std::printf("fa4 GPU tests on %s (sm_%d%d)\n", gpus[0].name.c_str(), gpus[0].cc_major, gpus[0].cc_minor);
  const int rc = RUN_ALL_TESTS();
  if (::testing::UnitTest::GetInstance()->test_to_run_count() == 0) {
    std::printf("FAILED: a GPU is present but no GPU test ran\n");
    return 1;
  }
  return rc;
}
