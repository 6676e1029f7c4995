// Composition: per-step time under a role schedule, then work tiles list-scheduled over the SMs.
#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <stdexcept>

#include "model/model.hpp"

namespace fa4::model {

StepTime step_time(const Hardware& hw, const TileCost& c, Schedule schedule) {
  StepTime s;
  // The tensor-core side is fed from SMEM, so MMA and operand traffic overlap each other; so do MUFU and the
  // issue slots on the softmax side (different pipes, same warps).
  s.tensor_side = std::max(c.mma_cycles, c.smem_cycles) / kEfficiency.sustained;
  s.softmax_side = std::max(c.mufu_cycles, c.alu_cycles / kEfficiency.alu_issue) / kEfficiency.sustained;
  const double serial = s.tensor_side + s.softmax_side;
  if (schedule == Schedule::serial) {
    s.step = serial;
  } else if (hw.tmem_kib.value > 0) {
    s.step = std::max(s.tensor_side, s.softmax_side);
  } else {
    const double p = kEfficiency.overlap_exponent_regs;
    s.step = std::pow(std::pow(s.tensor_side, p) + std::pow(s.softmax_side, p), 1 / p);
  }
  s.fill = serial - s.step;  // the first step of a work tile has nothing to overlap with
  return s;
}

double work_tile_io_cycles(const Hardware& hw, const TileCost& c) {
  const double bytes = c.prologue_bytes + c.epilogue_bytes;
  if (bytes <= 0) return 0;
  const double fair_share_bytes_per_clk =
      hw.hbm_tb_per_s.value * 1e12 * kEfficiency.hbm_achieved / hw.sm_count.value / (hw.clock_ghz.value * 1e9);
  const double staging = (c.epilogue_smem_bytes / hw.smem_bytes_per_clk.value +
                          c.epilogue_alu_instructions / (hw.issue_per_clk.value * kEfficiency.alu_issue)) /
                         kEfficiency.sustained;
  return kEfficiency.exposed_io_latency + bytes / (kEfficiency.exposed_io_share * fair_share_bytes_per_clk) +
         staging;
}

double list_schedule_makespan(std::vector<double> work, int units, bool longest_first) {
  if (units <= 0) throw std::invalid_argument("units must be positive");
  if (work.empty()) return 0;
  if (std::all_of(work.begin(), work.end(), [&](double w) { return w == work.front(); }))
    return std::ceil(static_cast<double>(work.size()) / units) * work.front();  // equal tiles: whole waves
  if (longest_first) std::sort(work.begin(), work.end(), std::greater<>());
  // Each unit takes the next tile when it becomes free (persistent kernels and the hardware block
  // scheduler both behave this way).
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int i = 0; i < units; ++i) free_at.push(0.0);
  double makespan = 0;
  for (double w : work) {
    const double start = free_at.top();
    free_at.pop();
    free_at.push(start + w);
    makespan = std::max(makespan, start + w);
  }
  return makespan;
}

namespace {

long ceil_div(long a, long b) { return (a + b - 1) / b; }

// Number of tile steps of each work tile, in launch order (batch, head, block ascending).
std::vector<long> steps_per_work_tile(const TileConfig& t, const Problem& p) {
  const long sq = p.seqlen_q, sk = p.seqlen_k, offset = sk - sq;  // causal is bottom-right aligned
  std::vector<long> one_head;
  if (t.pass == Pass::fwd) {
    const long rows = static_cast<long>(t.m) * t.q_tiles_per_cta * t.ctas;
    for (long r0 = 0; r0 < sq; r0 += rows) {
      const long keys = p.causal ? std::clamp(std::min(r0 + rows, sq) + offset, 0L, sk) : sk;
      one_head.push_back(ceil_div(keys, t.n));
    }
  } else {
    const long cols = static_cast<long>(t.n) * t.ctas;
    const long q_blocks = ceil_div(sq, t.m);
    for (long c0 = 0; c0 < sk; c0 += cols) {
      const long first_row = p.causal ? std::max(0L, c0 - offset) : 0;
      one_head.push_back(first_row >= sq ? 0 : q_blocks - first_row / t.m);
    }
  }
  std::vector<long> all;
  all.reserve(one_head.size() * p.batch * p.heads);
  for (long bh = 0; bh < static_cast<long>(p.batch) * p.heads; ++bh) all.insert(all.end(), one_head.begin(), one_head.end());
  return all;
}

// Compulsory HBM traffic of the main kernel.
double compulsory_hbm_bytes(const TileConfig& t, const Problem& p) {
  const double bh = static_cast<double>(p.batch) * p.heads, elem = bytes_per_element(t.dtype);
  const double q = bh * p.seqlen_q * t.d, k = bh * p.seqlen_k * t.d, rows = bh * p.seqlen_q;
  if (t.pass == Pass::fwd) return (2 * q + 2 * k) * elem + rows * 4;  // Q, K, V in; O out; LSE
  // Q, dO, K, V in; dK, dV out; LSE and D in; the fp32 dQ accumulator read into L2 and written back once.
  return (2 * q + 2 * k + 2 * k) * elem + 2 * rows * 4 + 2 * q * 4;
}

// HBM traffic of the backward's preprocess and postprocess kernels (fa3.md §4.1, fa4.md §5.1), which run
// before and after the main kernel and so do not overlap it.
double aux_kernel_bytes(const TileConfig& t, const Problem& p) {
  if (t.pass == Pass::fwd) return 0;
  const double bh = static_cast<double>(p.batch) * p.heads, elem = bytes_per_element(t.dtype);
  const double q = bh * p.seqlen_q * t.d, rows = bh * p.seqlen_q;
  const double pre = 2 * q * elem + rows * 4 + 2 * rows * 4 + q * 4;  // read O, dO, LSE; write D, LSE*log2e; zero dQacc
  const double post = q * 4 + q * elem;                                 // read dQacc, write dQ
  return pre + post;
}

}  // namespace

Prediction predict(const Hardware& hw, const TileConfig& t, const Problem& p, Schedule schedule) {
  if (p.batch < 1 || p.heads < 1 || p.seqlen_q < 1 || p.seqlen_k < 1)
    throw std::invalid_argument("batch, heads and sequence lengths must be >= 1");
  Prediction r;
  r.tile = tile_cost(hw, t);
  r.time = step_time(hw, r.tile, schedule);
  r.units = static_cast<int>(hw.sm_count.value) / t.ctas;

  // A forward work tile runs q_tiles_per_cta tile steps per KV block; the backward one step per Q block.
  const double cycles_per_step = r.time.step * (t.pass == Pass::fwd ? t.q_tiles_per_cta : 1);
  r.io_cycles = work_tile_io_cycles(hw, r.tile);
  std::vector<double> work;
  for (long steps : steps_per_work_tile(t, p))
    work.push_back(steps > 0 ? steps * cycles_per_step + r.time.fill + r.io_cycles : 0);
  r.work_tiles = static_cast<long>(work.size());
  double total_work = 0;
  for (double w : work) total_work += w;
  r.makespan_cycles = list_schedule_makespan(std::move(work), r.units, p.lpt);
  r.wave_efficiency = r.makespan_cycles > 0 ? total_work / (r.units * r.makespan_cycles) : 0;

  r.flops = 4.0 * p.batch * p.heads * p.seqlen_q * p.seqlen_k * t.d * (p.causal ? 0.5 : 1) *
            (t.pass == Pass::bwd ? 2.5 : 1);
  const double hz = hw.clock_ghz.value * 1e9;
  r.compute_seconds = r.makespan_cycles / hz;
  const double hbm_bytes_per_s = hw.hbm_tb_per_s.value * 1e12 * kEfficiency.hbm_achieved;
  r.hbm_bytes = compulsory_hbm_bytes(t, p);
  r.hbm_seconds = r.hbm_bytes / hbm_bytes_per_s;
  r.aux_bytes = aux_kernel_bytes(t, p);
  r.aux_seconds = r.aux_bytes / hbm_bytes_per_s;
  const double seconds = std::max(r.compute_seconds, r.hbm_seconds) + r.aux_seconds;
  r.tflops = seconds > 0 ? r.flops / seconds / 1e12 : 0;
  r.tile_bound_tflops = r.tile.flops / r.tile.bound_cycles * hw.sm_count.value * hz / 1e12;
  return r;
}

}  // namespace fa4::model
