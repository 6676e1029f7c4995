// The sm_90a backward's path choices (fa4::sm90::backward_paths: what the launch sets its kernel flags from), per
// row, mode and FA4_BWD_* override: each A/B switch reaches the kernel where it applies and nowhere else. Host
// code only, so it runs in CI; built where the sm_90a kernels are (FA4_WITH_SM90).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "api/validate.hpp"
#include "fa4/fa4.hpp"
#include "testing/env.hpp"

#if FA4_WITH_SM90
#include "cuda/sm90/bwd/walk_order.hpp"
#include "cuda/sm90/launch.hpp"

namespace {

using fa4::testing::EnvOverride;

// The problem of a small bf16 batch at head dim d with seqlen_k keys (the tensors' data is never read). The
// default key count is past kShortKeysMax, where the rows' own chain counts apply.
fa4::detail::Problem problem(int d, bool deterministic, bool causal, int64_t seqlen_k, int64_t seqlen_q) {
  static std::vector<uint16_t> buffer(1 << 21);
  const fa4::Tensor q = fa4::Tensor::contiguous(buffer.data(), fa4::DType::bf16, fa4::Device::cpu, {1, seqlen_q, 4, d});
  const fa4::Tensor kv =
      fa4::Tensor::contiguous(buffer.data(), fa4::DType::bf16, fa4::Device::cpu, {1, seqlen_k, 2, d});
  fa4::Options o;
  o.deterministic = deterministic;
  o.causal = causal;
  return fa4::detail::validate_inputs("test", q, kv, kv, o);
}
fa4::sm90::BackwardPaths paths(int d, bool deterministic, bool causal = false, int64_t seqlen_k = 2048,
                               int64_t seqlen_q = 256) {
  return fa4::sm90::backward_paths(problem(d, deterministic, causal, seqlen_k, seqlen_q), false);
}

TEST(BackwardPaths, DefaultsPerRow) {
  std::vector<std::unique_ptr<EnvOverride>> unset;  // the defaults, whatever the caller's environment
  for (const char* name : {"FA4_BWD_CLUSTER", "FA4_BWD_DQ_REGISTER_ADDS", "FA4_BWD_DET_REGISTER_ADDS",
                           "FA4_BWD_DET_TWO_BUFFERS", "FA4_BWD_DET_CHAINS", "FA4_BWD_DET_HELPER",
                           "FA4_BWD_DET_STORE_FIRST", "FA4_BWD_DET_SLAB_RELEASE", "FA4_BWD_DET_ROTATED"})
    unset.push_back(std::make_unique<EnvOverride>(name, nullptr));
  // Default mode: register adds at d = 128 only (perf-log B20); nothing deterministic.
  for (int d : {64, 128, 192, 256}) {
    const auto b = paths(d, false);
    EXPECT_EQ(b.dq_register_adds, d == 128) << d;
    EXPECT_FALSE(b.det_register_adds || b.det_two_buffers || b.det_turn_helpers || b.det_store_first) << d;
    EXPECT_FALSE(b.cluster_pair) << d;
    EXPECT_EQ(b.det_chains, 1) << d;
  }
  // Deterministic: store-first everywhere; register adds in turn at d = 128 unmasked (B24), else the writers with
  // two buffers at d = 64 and 128 (B23, B27) and their slab release on key-split rows; turn helpers on column-split rows;
  // chains 4 / 1 / 4 / 4 without a mask, 1 with one (B17).
  for (int d : {64, 128, 192, 256})
    for (bool causal : {false, true}) {
      const auto b = paths(d, true, causal);
      const bool register_adds = d == 128 && !causal;
      EXPECT_TRUE(b.det_store_first) << d << causal;
      EXPECT_EQ(b.det_register_adds, register_adds) << d << causal;
      EXPECT_EQ(b.det_two_buffers, (d == 64 || d == 128) && !register_adds) << d << causal;
      EXPECT_EQ(b.det_slab_release, d <= 128 && !register_adds) << d << causal;
      EXPECT_EQ(b.det_turn_helpers, d > 128) << d << causal;
      EXPECT_FALSE(b.dq_register_adds) << d << causal;
      EXPECT_EQ(b.det_chains, d == 128 || causal ? 1 : 4) << d << causal;
      EXPECT_FALSE(b.det_rotated_walk) << d << causal;  // 16-32 key blocks on 4-8 positions: does not fit
    }
}

// Up to 1024 keys, at most two chains (perf-log B26); the masked rows and d = 128 keep one.
TEST(BackwardPaths, ShortKeysCapTheDeterministicChains) {
  const EnvOverride unset("FA4_BWD_DET_CHAINS", nullptr);
  const EnvOverride chains_not_rotated("FA4_BWD_DET_ROTATED", "0");  // short keys fit the rotated walk's positions
  for (int d : {64, 128, 192, 256})
    for (bool causal : {false, true}) {
      const int row_chains = d == 128 || causal ? 1 : 4;
      for (int64_t seqlen_k : {1, 512, 1024})
        EXPECT_EQ(paths(d, true, causal, seqlen_k).det_chains, std::min(row_chains, 2)) << d << causal << seqlen_k;
      EXPECT_EQ(paths(d, true, causal, 1025).det_chains, row_chains) << d << causal;
      EXPECT_EQ(paths(d, false, causal, 512).det_chains, 1) << d << causal;  // outside deterministic mode
    }
  const EnvOverride four("FA4_BWD_DET_CHAINS", "4");  // the override is not capped (A/B runs)
  EXPECT_EQ(paths(64, true, false, 512).det_chains, 4);
}

TEST(BackwardPaths, SwitchesReachTheKernelWhereTheyApply) {
  {
    const EnvOverride on("FA4_BWD_DQ_REGISTER_ADDS", "1");
    EXPECT_TRUE(paths(64, false).dq_register_adds);
    EXPECT_FALSE(paths(256, false).dq_register_adds);  // column-split rows add from registers anyway
    EXPECT_FALSE(paths(64, true).dq_register_adds);    // deterministic mode keeps its own path
  }
  {
    const EnvOverride off("FA4_BWD_DQ_REGISTER_ADDS", "0");
    EXPECT_FALSE(paths(128, false).dq_register_adds);
  }
  {
    const EnvOverride on("FA4_BWD_DET_REGISTER_ADDS", "1");
    for (int d : {64, 128}) {
      const auto b = paths(d, true);
      EXPECT_TRUE(b.det_register_adds) << d;
      EXPECT_FALSE(b.det_two_buffers || b.det_slab_release) << d;  // no writers then
    }
    EXPECT_FALSE(paths(256, true).det_register_adds);
    EXPECT_FALSE(paths(128, false).det_register_adds);
  }
  {
    const EnvOverride off("FA4_BWD_DET_REGISTER_ADDS", "0");
    const auto b = paths(128, true);
    EXPECT_FALSE(b.det_register_adds);
    EXPECT_TRUE(b.det_two_buffers && b.det_slab_release);  // the writers again
  }
  {
    const EnvOverride off("FA4_BWD_DET_TWO_BUFFERS", "0");
    EXPECT_FALSE(paths(128, true, /*causal=*/true).det_two_buffers);
  }
  {
    const EnvOverride off("FA4_BWD_DET_STORE_FIRST", "0");
    EXPECT_FALSE(paths(64, true).det_store_first);
  }
  {
    const EnvOverride chains("FA4_BWD_DET_CHAINS", "2");
    EXPECT_EQ(paths(128, true).det_chains, 2);
    EXPECT_EQ(paths(128, false).det_chains, 1);
  }
  {
    const EnvOverride chains("FA4_BWD_DET_CHAINS", "3");  // any count the workspace holds (perf-log B28)
    EXPECT_EQ(paths(256, true).det_chains, 3);
  }
  for (const char* value : {"0", "5", "22", "2x"}) {
    const EnvOverride chains("FA4_BWD_DET_CHAINS", value);
    EXPECT_THROW(paths(256, true), fa4::Error) << value;
  }
  {
    const EnvOverride pair("FA4_BWD_CLUSTER", "1");
    const auto b = paths(128, false);
    EXPECT_TRUE(b.cluster_pair);
    EXPECT_FALSE(b.dq_register_adds);  // the pair keeps its exchange and writer
  }
  {
    const EnvOverride bad("FA4_BWD_DET_REGISTER_ADDS", "yes");
    EXPECT_THROW(paths(128, true), fa4::Error);
  }
}

// The rotated walk (on by default, perf-log B29): deterministic calls without a mask whose key blocks fit on
// distinct walk positions (n <= group · m_tiles) and on the SMs, with one chain; nowhere else.
TEST(BackwardPaths, RotatedWalkWhereItApplies) {
  const EnvOverride chains("FA4_BWD_DET_CHAINS", nullptr);
  {
    const EnvOverride unset("FA4_BWD_DET_ROTATED", nullptr);
    EXPECT_TRUE(paths(256, true, false, 1024, 1024).det_rotated_walk);  // the default
    const EnvOverride off("FA4_BWD_DET_ROTATED", "0");
    const auto b = paths(256, true, false, 1024, 1024);
    EXPECT_FALSE(b.det_rotated_walk);
    EXPECT_EQ(b.det_chains, 2);  // the row's chains, capped up to 1024 keys
  }
  const EnvOverride on("FA4_BWD_DET_ROTATED", "1");
  // q [1, 1024, 4, d], k [1, 1024, 2, d]: group 2; d = 256 (64 × 64 tiles): 16 key blocks, 32 positions.
  for (int d : {64, 128, 192, 256}) {
    const auto b = paths(d, true, false, 1024, 1024);
    EXPECT_TRUE(b.det_rotated_walk) << d;
    EXPECT_EQ(b.det_chains, 1) << d;
  }
  EXPECT_FALSE(paths(256, true, /*causal=*/true, 1024, 1024).det_rotated_walk);  // a mask
  EXPECT_FALSE(paths(256, false, false, 1024, 1024).det_rotated_walk);            // not deterministic
  EXPECT_TRUE(paths(256, true, false, 2048, 1024).det_rotated_walk);               // 32 blocks on 32 positions
  EXPECT_FALSE(paths(256, true, false, 2049, 1024).det_rotated_walk);              // 33 blocks
  const auto p = problem(256, true, false, 1024, 1024);
  EXPECT_TRUE(fa4::sm90::backward_paths(p, false, /*sms=*/16).det_rotated_walk);
  EXPECT_FALSE(fa4::sm90::backward_paths(p, false, /*sms=*/15).det_rotated_walk);  // not resident at once
  EXPECT_FALSE(fa4::sm90::backward_paths(p, /*varlen=*/true).det_rotated_walk);
  {
    const EnvOverride pair("FA4_BWD_CLUSTER", "1");  // never with the pair (deterministic mode has none)
    EXPECT_TRUE(paths(128, true, false, 1024, 1024).det_rotated_walk);
  }
  const EnvOverride bad("FA4_BWD_DET_ROTATED", "2");
  EXPECT_THROW(paths(256, true, false, 1024, 1024), fa4::Error);
}

// The rotated walk's turns (walk_order.hpp) against the arrival steps they stand for: on every position, the
// blocks ordered by the step at which they reach it, for every n and P >= n up to 40.
TEST(BwdRotatedWalk, TurnsFollowTheArrivalStepOnEveryPosition) {
  for (int32_t n = 1; n <= 40; ++n)
    for (int32_t positions = n; positions <= 40; ++positions) {
      const fa4::sm90::RotatedWalk walk{uint32_t(n), uint32_t(positions)};
      for (int32_t j = 1; j < n; ++j) ASSERT_LT(walk.start(j - 1), walk.start(j)) << n << " " << positions;
      for (int32_t t = 0; t < positions; ++t) {
        std::vector<int32_t> steps(n), seen(n, 0);
        for (int32_t j = 0; j < n; ++j) steps[j] = ((t - walk.start(j)) % positions + positions) % positions;
        for (int32_t j = 0; j < n; ++j) {
          const int32_t earlier = int32_t(std::count_if(steps.begin(), steps.end(), [&](int32_t s) { return s < steps[j]; }));
          const int32_t turn = walk.turn(j, t);
          ASSERT_EQ(turn, earlier) << "n " << n << " P " << positions << " t " << t << " j " << j;
          ++seen[turn];
        }
        for (int32_t k = 0; k < n; ++k) ASSERT_EQ(seen[k], 1) << n << " " << positions << " " << t;
      }
    }
  // The 32-bit arithmetic up to the host's limit (n · P < 2^31): starts and turns against 64-bit ones.
  for (int64_t n : {int64_t{16}, int64_t{132}}) {
    const int64_t positions = (fa4::sm90::RotatedWalk::kMaxProduct - 1) / n;
    const fa4::sm90::RotatedWalk walk{uint32_t(n), uint32_t(positions)};
    for (int64_t j : {int64_t{0}, int64_t{1}, n / 2, n - 1}) {
      ASSERT_EQ(walk.start(int32_t(j)), j * positions / n) << n << " " << j;
      for (int64_t t : {int64_t{0}, positions / 3, positions - 2, positions - 1}) {
        const int64_t a = ((t + 1) * n + positions - 1) / positions;
        ASSERT_EQ(walk.turn(int32_t(j), int32_t(t)), ((a - 1 - j) % n + n) % n) << n << " " << j << " " << t;
      }
    }
  }
}

}  // namespace
#endif
