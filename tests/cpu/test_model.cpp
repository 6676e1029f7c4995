// The feeds-and-speeds model (src/model): FA4's published per-tile figures reproduced exactly, composition
// and scheduling properties, and the prediction error against the FA3/cuDNN throughputs on our H200.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "model/model.hpp"

namespace m = fa4::model;

namespace {

m::TileConfig b200_tile(m::Pass pass, int ctas) {
  m::TileConfig t;  // 128 x 128 x 128 bf16
  t.pass = pass;
  t.ctas = ctas;
  return t;
}

}  // namespace

// reference/fa4.md §1.4: forward M = N = d = 128 bf16 on B200.
TEST(ModelTile, Fa4ForwardB200PerTileFigures) {
  const m::TileCost c = m::tile_cost(m::hardware(m::Gpu::b200), b200_tile(m::Pass::fwd, 1));
  EXPECT_EQ(c.mma_cycles, 1024);
  EXPECT_EQ(c.mufu_cycles, 1024);
  EXPECT_EQ(c.smem_cycles, 768);  // Q, K, V read once each; P from TMEM
}

TEST(ModelTile, Fa4ForwardB200TwoQTilesDouble) {
  m::TileConfig t = b200_tile(m::Pass::fwd, 1);
  t.m = 256;
  const m::TileCost c = m::tile_cost(m::hardware(m::Gpu::b200), t);
  EXPECT_EQ(c.mma_cycles, 2048);
  EXPECT_EQ(c.mufu_cycles, 2048);
  EXPECT_EQ(c.smem_cycles, 1536);  // each 128-row MMA re-reads K and V
}

TEST(ModelTile, Fa4BackwardB200OneCta) {
  const m::TileCost c = m::tile_cost(m::hardware(m::Gpu::b200), b200_tile(m::Pass::bwd, 1));
  EXPECT_EQ(c.mma_cycles, 2560);
  EXPECT_EQ(c.mufu_cycles, 1024);
  EXPECT_EQ(c.smem_operand_bytes / 128, 2048);
  EXPECT_EQ(c.smem_staging_bytes / 128, 256);  // dS write
  EXPECT_EQ(c.smem_dq_bytes / 128, 1024);      // dQ fp32 write + read
  EXPECT_EQ(c.smem_cycles, 3328);
  EXPECT_EQ(c.bound, m::Resource::smem);
}

TEST(ModelTile, Fa4BackwardB200TwoCta) {
  const m::TileCost c = m::tile_cost(m::hardware(m::Gpu::b200), b200_tile(m::Pass::bwd, 2));
  EXPECT_EQ(c.mma_cycles, 2560);
  EXPECT_EQ(c.smem_operand_bytes / 128, 1536);
  EXPECT_EQ(c.smem_staging_bytes / 128, 256);
  EXPECT_EQ(c.smem_exchange_bytes / 128, 384);
  EXPECT_EQ(c.smem_dq_bytes / 128, 512);
  EXPECT_EQ(c.smem_cycles, 2688);
  EXPECT_EQ(c.bound, m::Resource::smem);  // +5% over MMA (fa4.md §1.4)
  EXPECT_NEAR(c.smem_cycles / c.mma_cycles, 1.05, 0.005);
}

// The exp / MMA cycle ratio per score element is R_mma / (64 d): 64/d on Hopper, 128/d on B200 (H200.md).
TEST(ModelTile, ExpToMmaRatioFollowsHeadDim) {
  for (int d : {64, 128, 256}) {
    m::TileConfig t;
    t.d = d;
    const m::TileCost h100 = m::tile_cost(m::hardware(m::Gpu::h100), t);
    const m::TileCost b200 = m::tile_cost(m::hardware(m::Gpu::b200), t);
    EXPECT_DOUBLE_EQ(h100.mufu_cycles / h100.mma_cycles, 64.0 / d);
    EXPECT_DOUBLE_EQ(b200.mufu_cycles / b200.mma_cycles, 128.0 / d);
  }
}

TEST(ModelTile, EmulationMovesExpsFromMufuToAlu) {
  const m::Hardware& hw = m::hardware(m::Gpu::b200);
  m::TileConfig t;
  const m::TileCost none = m::tile_cost(hw, t);
  t.emulated_fraction = 0.25;
  const m::TileCost quarter = m::tile_cost(hw, t);
  EXPECT_DOUBLE_EQ(quarter.mufu_cycles, 0.75 * none.mufu_cycles);
  EXPECT_GT(quarter.alu_cycles, none.alu_cycles);
  EXPECT_EQ(quarter.exps, none.exps);
}

TEST(ModelTile, ConditionalRescaleCutsAluAndTmem) {
  const m::Hardware& hw = m::hardware(m::Gpu::b200);
  m::TileConfig t;
  const m::TileCost always = m::tile_cost(hw, t);
  t.rescale_frequency = 0.1;
  const m::TileCost lazy = m::tile_cost(hw, t);
  EXPECT_LT(lazy.alu_cycles, always.alu_cycles);
  EXPECT_LT(lazy.tmem_bytes, always.tmem_bytes);
  EXPECT_EQ(m::tile_cost(m::hardware(m::Gpu::h200), t).tmem_bytes, 0);  // Hopper has no TMEM
}

// Hopper wgmma is m64 per warpgroup: every warpgroup reads the whole B operand (fa4.md §1.4 estimate).
TEST(ModelTile, HopperWarpgroupsEachReadB) {
  m::TileConfig t;  // 128 x 128 x 128, P in registers (RS)
  const m::TileCost c = m::tile_cost(m::hardware(m::Gpu::h200), t);
  EXPECT_EQ(c.smem_operand_bytes, (32 + 2 * 32 + 2 * 32) * 1024);  // Q once, K and V twice: 160 KB
  EXPECT_EQ(c.smem_cycles, 1280);
}

// fa4's sm_90a backward tile at d = 128: 64 queries x 128 keys.
m::TileConfig hopper_backward_d128_tile() {
  m::TileConfig t;
  t.pass = m::Pass::bwd;
  t.m = 64;
  t.n = 128;
  return t;
}

// The Hopper cluster pair (fa4's sm_90a backward tile, 64 queries x 128 keys, d = 128): each shared load and
// the dQ reduce-add happen once per pair, and the dQ partial's SMEM bytes move to the exchange, unchanged.
TEST(ModelTile, HopperClusterPairHalvesBackwardLoadsAndReduceAdds) {
  m::TileConfig t = hopper_backward_d128_tile();
  const m::Hardware& h200 = m::hardware(m::Gpu::h200);
  const m::TileCost one = m::tile_cost(h200, t);
  t.cluster = 2;
  const m::TileCost pair = m::tile_cost(h200, t);
  EXPECT_EQ(one.load_bytes, 2 * 64 * 128 * 2 + 2 * 64 * 4 + 64 * 128 * 4);  // Q, dO; LSE, D; dQ reduce-add
  EXPECT_EQ(pair.load_bytes, one.load_bytes / 2);
  EXPECT_EQ(pair.smem_exchange_bytes + pair.smem_dq_bytes, one.smem_dq_bytes);
  EXPECT_EQ(pair.smem_cycles, one.smem_cycles);
  EXPECT_EQ(pair.mma_cycles, one.mma_cycles);
}

// Hopper's dQ = dS K as fa4's sm_90a rows compute it: per 64-row chunk the two warpgroups split the head dim, each
// reading the chunk's dS and its own columns of K (at d = 128 dS is read twice, once per head-dim half); an 80-row tile
// (FlashAttention-3's, not a multiple of 64) computes dQ transposed, reading K once and dS^T per 64 columns of d.
TEST(ModelTile, HopperBackwardDqOperandsPerUnit) {
  m::TileConfig t = hopper_backward_d128_tile();
  const m::Hardware& h200 = m::hardware(m::Gpu::h200);
  // S^T, dP^T: K or V once, Q or dO per 64-key warpgroup; dV, dK: dO or Q per warpgroup (A from registers).
  auto others = [](int m) { return 2 * (128 * 128 * 2 + 2 * m * 128 * 2) + 2 * (2 * m * 128 * 2); };
  EXPECT_EQ(m::tile_cost(h200, t).smem_operand_bytes - others(64), 2 * (64 * 128 + 128 * 64) * 2);  // 64 KB
  EXPECT_EQ(m::tile_cost(h200, t).bound, m::Resource::smem);
  t.m = 80;
  EXPECT_EQ(m::tile_cost(h200, t).smem_operand_bytes - others(80), 2 * (128 * 64 + 128 * 80) * 2);  // 72 KB
  EXPECT_EQ(m::tile_cost(h200, t).bound, m::Resource::mma);
}

// fa4's d = 128 backward adds dQ from registers (perf-log B20): no SMEM staging bytes, and the 64×128 step that
// was shared-memory-bound by 5% becomes tensor-core-bound.
TEST(ModelTile, HopperBackwardDqFromRegistersDropsTheStaging) {
  m::TileConfig t = hopper_backward_d128_tile();
  const m::Hardware& h200 = m::hardware(m::Gpu::h200);
  const m::TileCost staged = m::tile_cost(h200, t);
  t.dq_from_registers = true;
  const m::TileCost adds = m::tile_cost(h200, t);
  EXPECT_EQ(staged.smem_dq_bytes, 2 * 64 * 128 * 4);
  EXPECT_EQ(adds.smem_dq_bytes, 0);
  EXPECT_EQ(staged.bound, m::Resource::smem);
  EXPECT_EQ(adds.bound, m::Resource::mma);
  t.cluster = 2;
  EXPECT_THROW(m::tile_cost(h200, t), std::invalid_argument);
}

TEST(ModelTile, RejectsInvalidConfigurations) {
  m::TileConfig t;
  t.ctas = 2;
  EXPECT_THROW(m::tile_cost(m::hardware(m::Gpu::h200), t), std::invalid_argument);
  t = {};
  t.emulated_fraction = 1.5;
  EXPECT_THROW(m::tile_cost(m::hardware(m::Gpu::b200), t), std::invalid_argument);
  t = {};
  t.pass = m::Pass::bwd;
  t.emulated_fraction = 0.25;
  EXPECT_THROW(m::tile_cost(m::hardware(m::Gpu::b200), t), std::invalid_argument);
  t = {};
  t.cluster = 2;  // the forward has no cluster pair
  EXPECT_THROW(m::tile_cost(m::hardware(m::Gpu::h200), t), std::invalid_argument);
  t.pass = m::Pass::bwd;  // Blackwell pairs through cta_group::2
  EXPECT_THROW(m::tile_cost(m::hardware(m::Gpu::b200), t), std::invalid_argument);
  EXPECT_NO_THROW(m::tile_cost(m::hardware(m::Gpu::h200), t));
}

TEST(ModelHardware, EveryValueHasASource) {
  for (m::Gpu gpu : m::all_gpus()) {
    const m::Hardware& hw = m::hardware(gpu);
    for (const m::Sourced* s : {&hw.sm_count, &hw.clock_ghz, &hw.mma_flop_per_clk, &hw.mma_fp8_flop_per_clk,
                                &hw.mufu_exp2_per_clk, &hw.issue_per_clk, &hw.smem_bytes_per_clk, &hw.hbm_tb_per_s,
                                &hw.tmem_kib})
      EXPECT_FALSE(s->source.empty()) << hw.name;
  }
  EXPECT_EQ(m::hardware(m::Gpu::b300).mufu_exp2_per_clk.value, 2 * m::hardware(m::Gpu::b200).mufu_exp2_per_clk.value);
  // 989 TFLOP/s dense BF16 at 1830 MHz: 132 SMs x 4096 FLOP/clk.
  EXPECT_NEAR(132 * m::hardware(m::Gpu::h100).mma_flop_per_clk.value * 1.83e9 / 1e12, 989.4, 0.1);
}

TEST(ModelCompose, SerialIsSumAndPingpongLiesBetweenBounds) {
  for (m::Gpu gpu : m::all_gpus()) {
    const m::Hardware& hw = m::hardware(gpu);
    const m::TileCost c = m::tile_cost(hw, m::default_tile(gpu, m::Pass::fwd, 64, false));
    const m::StepTime serial = m::step_time(hw, c, m::Schedule::serial);
    const m::StepTime pingpong = m::step_time(hw, c, m::Schedule::pingpong);
    EXPECT_DOUBLE_EQ(serial.step, serial.tensor_side + serial.softmax_side);
    EXPECT_EQ(serial.fill, 0);
    EXPECT_GE(pingpong.step, std::max(pingpong.tensor_side, pingpong.softmax_side));
    EXPECT_LT(pingpong.step, serial.step);
    EXPECT_DOUBLE_EQ(pingpong.step + pingpong.fill, serial.step);
  }
}

TEST(ModelWaves, EqualTilesFillWholeWaves) {
  EXPECT_EQ(m::list_schedule_makespan(std::vector<double>(264, 1.0), 132, false), 2.0);
  EXPECT_EQ(m::list_schedule_makespan(std::vector<double>(265, 1.0), 132, false), 3.0);
  EXPECT_EQ(m::list_schedule_makespan({}, 132, true), 0.0);
}

TEST(ModelWaves, LongestFirstHelpsCausalImbalance) {
  // Ascending causal row blocks (1..64 steps) on 8 units: natural order leaves the longest for last.
  std::vector<double> work;
  for (int i = 1; i <= 64; ++i) work.push_back(i);
  const double natural = m::list_schedule_makespan(work, 8, false);
  const double lpt = m::list_schedule_makespan(work, 8, true);
  EXPECT_LT(lpt, natural);
  EXPECT_GE(lpt, 64 * 65 / 2 / 8.0);  // never below perfect balance
}

TEST(ModelPredict, CausalPredictionUsesHalfTheFlopsAndLptHelps) {
  const m::Hardware& hw = m::hardware(m::Gpu::h200);
  const m::TileConfig t = m::default_tile(m::Gpu::h200, m::Pass::fwd, 128, true);
  m::Problem p{2, 16, 8192, 8192, true, false};
  const m::Prediction natural = m::predict(hw, t, p, m::Schedule::pingpong);
  p.lpt = true;
  const m::Prediction lpt = m::predict(hw, t, p, m::Schedule::pingpong);
  EXPECT_DOUBLE_EQ(natural.flops, 0.5 * 4 * 2 * 16 * 8192.0 * 8192 * 128);
  EXPECT_GE(lpt.tflops, natural.tflops);
  EXPECT_LE(lpt.wave_efficiency, 1.0);
}

TEST(ModelPredict, TwoCtaBackwardPaysOnB200) {
  const m::Hardware& hw = m::hardware(m::Gpu::b200);
  const m::Problem p{4, 16, 8192, 8192, false, false};  // PR #2280's shape
  const m::Prediction one = m::predict(hw, b200_tile(m::Pass::bwd, 1), p, m::Schedule::pingpong);
  const m::Prediction two = m::predict(hw, b200_tile(m::Pass::bwd, 2), p, m::Schedule::pingpong);
  EXPECT_GT(two.tflops, one.tflops);
  // Measured (fa4.md §1.2): 1CTA 1247.5, 2CTA 1359.8 TFLOP/s. Report the model's error; bound it loosely.
  std::printf("B200 bwd d128 s8k: model 1CTA %.0f (measured 1247.5, %+.1f%%), 2CTA %.0f (measured 1359.8, %+.1f%%)\n",
              one.tflops, 100 * (one.tflops / 1247.5 - 1), two.tflops, 100 * (two.tflops / 1359.8 - 1));
  EXPECT_NEAR(one.tflops / 1247.5, 1, 0.15);
  EXPECT_NEAR(two.tflops / 1359.8, 1, 0.15);
}

TEST(ModelPredict, Fa4ForwardB200NearMeasured) {
  const m::Hardware& hw = m::hardware(m::Gpu::b200);
  const m::TileConfig t = m::default_tile(m::Gpu::b200, m::Pass::fwd, 128, false);
  const m::Prediction p = m::predict(hw, t, {4, 16, 8192, 8192, false, false}, m::Schedule::pingpong);
  std::printf("B200 fwd d128 s8k: model %.0f, measured 1534.8 (PR #2280), %+.1f%%\n", p.tflops,
              100 * (p.tflops / 1534.8 - 1));
  EXPECT_NEAR(p.tflops / 1534.8, 1, 0.10);
}

// H200.md: a MUFU-bound softmax stream gains with 1/8 and 1/4 of the exps emulated and loses beyond 3/8.
TEST(ModelStream, EmulationSweetSpotMatchesH200Measurement) {
  const m::Hardware& hw = m::hardware(m::Gpu::h200);
  const double measured[] = {15.5, 16.5, 17.5, 14.7, 14.2};  // fractions 0, 1/8, 1/4, 3/8, 1/2
  double best_fraction = 0, best_rate = 0;
  for (int i = 0; i < 5; ++i) {
    const double f = i / 8.0, rate = m::softmax_stream_rate(hw, f);
    std::printf("stream, %d/8 emulated: model %.1f, measured %.1f elem/clk/SM (%+.0f%%)\n", i, rate, measured[i],
                100 * (rate / measured[i] - 1));
    if (rate > best_rate) best_rate = rate, best_fraction = f;
  }
  EXPECT_EQ(best_fraction, 0.25);
  EXPECT_LT(m::softmax_stream_rate(hw, 0.375), m::softmax_stream_rate(hw, 0.25));
}

// The issue's goal: FA3 forward and backward within 10% at seqlen >= 4k. cuDNN errors are printed, not asserted:
// the model does not know cuDNN's configuration (docs/model.md).
TEST(ModelValidation, H200PeerThroughputs) {
  int fa3_long = 0;
  for (const m::ValidationRow& r : m::validate_h200()) {
    const auto& meas = r.measured;
    std::printf("%-5s d=%3d %-6s s=%5d  fwd %4.0f model %4.0f %+6.1f%%   bwd %4.0f model %4.0f %+6.1f%%\n",
                std::string(meas.impl).c_str(), meas.d, meas.causal ? "causal" : "full", meas.seqlen,
                meas.fwd_tflops, r.fwd_predicted, 100 * r.fwd_error, meas.bwd_tflops, r.bwd_predicted,
                100 * r.bwd_error);
    EXPECT_TRUE(std::isfinite(r.fwd_error) && std::isfinite(r.bwd_error));
    if (meas.impl == "FA3" && meas.seqlen >= 4096) {
      EXPECT_LT(std::abs(r.fwd_error), 0.10) << "FA3 fwd d=" << meas.d << " causal=" << meas.causal
                                             << " seqlen=" << meas.seqlen;
      EXPECT_LT(std::abs(r.bwd_error), 0.10) << "FA3 bwd d=" << meas.d << " causal=" << meas.causal
                                             << " seqlen=" << meas.seqlen;
      ++fa3_long;
    }
  }
  EXPECT_EQ(fa3_long, 16);
}

// The backward's costs outside its steps (docs/model.md): separate pre/postprocess HBM kernels and, per
// non-persistent work tile, the exposed K/V/Q/dO loads and dK/dV/dQ stores. The forward has neither.
TEST(ModelPredict, BackwardPaysAuxKernelsAndWorkTileIo) {
  const m::Hardware& hw = m::hardware(m::Gpu::h200);
  const m::Problem p{4, 16, 4096, 4096, false, false};
  const m::Prediction fwd = m::predict(hw, m::default_tile(m::Gpu::h200, m::Pass::fwd, 128, false), p,
                                       m::Schedule::pingpong);
  EXPECT_EQ(fwd.aux_seconds, 0);
  EXPECT_EQ(fwd.io_cycles, 0);
  const m::TileConfig t = m::default_tile(m::Gpu::h200, m::Pass::bwd, 128, false);  // 80 x 128
  const m::Prediction bwd = m::predict(hw, t, p, m::Schedule::serial);
  // Preprocess reads O, dO (bf16) and LSE, writes D and LSE*log2e, zeroes the fp32 dQ accumulator; postprocess
  // reads the accumulator and writes dQ: 14 bytes per Q element plus 12 per row.
  const double q = 4.0 * 16 * 4096 * 128, rows = 4.0 * 16 * 4096;
  EXPECT_DOUBLE_EQ(bwd.aux_bytes, 14 * q + 12 * rows);
  EXPECT_NEAR(bwd.aux_seconds * 1e6, (14 * q + 12 * rows) / 4.24e6, 1e-6);  // at the measured 4.24 TB/s
  EXPECT_DOUBLE_EQ(bwd.tile.prologue_bytes, 2 * 128 * 128 * 2 + 2 * 80 * 128 * 2 + 2 * 80 * 4);
  EXPECT_DOUBLE_EQ(bwd.tile.epilogue_bytes, 2 * 128 * 128 * 2 + 80 * 128 * 4);
  EXPECT_GT(bwd.io_cycles, 6000);  // ~210 KB at 30.7 B/clk plus latency and staging
  EXPECT_LT(bwd.io_cycles, 9000);
  // The mask on every step (FA3 hdim > 64, causal) costs issue slots; hdim 64 masks only the diagonal steps.
  const m::TileConfig causal = m::default_tile(m::Gpu::h200, m::Pass::bwd, 128, true);
  EXPECT_TRUE(causal.mask_every_step);
  EXPECT_FALSE(m::default_tile(m::Gpu::h200, m::Pass::bwd, 64, true).mask_every_step);
  m::TileConfig unmasked = causal;
  unmasked.mask_every_step = false;
  EXPECT_DOUBLE_EQ(m::tile_cost(hw, causal).alu_instructions - m::tile_cost(hw, unmasked).alu_instructions,
                   2.0 * causal.m * causal.n);
}
