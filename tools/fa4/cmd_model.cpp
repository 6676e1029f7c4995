// `fa4 model`: the feeds-and-speeds model (src/model) for one configuration on one or all GPUs, or its
// validation against the peer throughputs measured on our H200.
#include <fmt/format.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "model/model.hpp"

namespace fa4::cli {

namespace {

namespace m = fa4::model;
using nlohmann::json;

struct ModelOptions {
  std::string gpu = "h200";
  std::string pass = "fwd";
  std::string dtype = "bf16";
  int d = 128;
  std::optional<int> tile_m, tile_n, ctas, cluster, batch, heads, seqlen_k;
  int seqlen = 4096;
  bool causal = false;
  bool lpt = false;
  bool dq_from_registers = false;
  std::optional<double> emulated_fraction, rescale_frequency;
  std::optional<std::string> schedule;
  bool json = false;
  bool validate = false;
};

const std::map<std::string, m::Gpu> kGpus{
    {"h100", m::Gpu::h100}, {"h200", m::Gpu::h200}, {"b200", m::Gpu::b200}, {"b300", m::Gpu::b300}};
const std::map<std::string, m::DType> kDtypes{
    {"bf16", m::DType::bf16}, {"fp16", m::DType::fp16}, {"fp8", m::DType::fp8}};

std::vector<m::Gpu> selected_gpus(const ModelOptions& o) {
  if (o.gpu == "all") return {m::all_gpus().begin(), m::all_gpus().end()};
  return {kGpus.at(o.gpu)};
}

// The reference kernel's configuration for this GPU, with the user's overrides applied.
m::TileConfig tile_for(m::Gpu gpu, const ModelOptions& o) {
  const m::Pass pass = o.pass == "fwd" ? m::Pass::fwd : m::Pass::bwd;
  m::TileConfig t = m::default_tile(gpu, pass, o.d, o.causal, kDtypes.at(o.dtype));
  if (o.tile_m) t.m = *o.tile_m;
  if (o.tile_n) t.n = *o.tile_n;
  if (o.ctas) {
    if (*o.ctas == 2 && !m::hardware(gpu).two_cta_mma)
      throw CLI::ValidationError("--ctas", fmt::format("2-CTA MMA needs Blackwell (b200, b300), not {}", m::name(gpu)));
    t.ctas = *o.ctas;
  }
  if (o.cluster) {
    if (*o.cluster == 2 && (pass != m::Pass::bwd || m::hardware(gpu).two_cta_mma))
      throw CLI::ValidationError("--cluster", fmt::format("a cluster pair models the Hopper backward (--pass bwd on "
                                                          "h100, h200), not {} {}", m::name(gpu), o.pass));
    t.cluster = *o.cluster;
  }
  if (o.dq_from_registers) {
    if (pass != m::Pass::bwd || m::hardware(gpu).two_cta_mma || t.cluster == 2)
      throw CLI::ValidationError("--dq-from-registers", fmt::format("models the one-CTA Hopper backward (--pass bwd on "
                                                                    "h100, h200, no --cluster 2), not {} {}",
                                                                    m::name(gpu), o.pass));
    t.dq_from_registers = true;
  }
  if (o.emulated_fraction) t.emulated_fraction = *o.emulated_fraction;
  if (o.rescale_frequency) t.rescale_frequency = *o.rescale_frequency;
  return t;
}

m::Problem problem_for(const ModelOptions& o) {
  // Default shape: the benchmark's 16k tokens and hidden 2048 (DESIGN.md §5).
  return {o.batch.value_or(std::max(1, 16384 / o.seqlen)), o.heads.value_or(std::max(1, 2048 / o.d)), o.seqlen,
          o.seqlen_k.value_or(o.seqlen), o.causal, o.lpt};
}

// One GPU's configuration and the model's answer for it.
struct Evaluated {
  m::Gpu gpu;
  m::TileConfig tile;
  m::Schedule schedule;
  m::Prediction prediction;
};

std::vector<Evaluated> evaluate(const ModelOptions& o, const m::Problem& problem) {
  std::vector<Evaluated> out;
  for (m::Gpu gpu : selected_gpus(o)) {
    const m::TileConfig t = tile_for(gpu, o);
    const m::Schedule schedule = !o.schedule             ? m::default_schedule(gpu, t.pass)
                                 : *o.schedule == "serial" ? m::Schedule::serial
                                                           : m::Schedule::pingpong;
    out.push_back({gpu, t, schedule, m::predict(m::hardware(gpu), t, problem, schedule)});
  }
  return out;
}

json sourced(const m::Sourced& s) { return {{"value", s.value}, {"source", s.source}}; }

json to_json(const Evaluated& e) {
  const auto& [gpu, t, schedule, p] = e;
  const m::Hardware& hw = m::hardware(gpu);
  const m::TileCost& c = p.tile;
  return {
      {"gpu", m::name(gpu)},
      {"hardware",
       {{"name", hw.name}, {"sm_count", sourced(hw.sm_count)}, {"clock_ghz", sourced(hw.clock_ghz)},
        {"mma_flop_per_clk", sourced(hw.mma_flop_per_clk)}, {"mma_fp8_flop_per_clk", sourced(hw.mma_fp8_flop_per_clk)},
        {"mufu_exp2_per_clk", sourced(hw.mufu_exp2_per_clk)}, {"issue_per_clk", sourced(hw.issue_per_clk)},
        {"smem_bytes_per_clk", sourced(hw.smem_bytes_per_clk)}, {"hbm_tb_per_s", sourced(hw.hbm_tb_per_s)},
        {"tmem_kib", sourced(hw.tmem_kib)}}},
      {"tile",
       {{"pass", m::name(t.pass)}, {"dtype", m::name(t.dtype)}, {"m", t.m}, {"n", t.n}, {"d", t.d}, {"ctas", t.ctas}, {"cluster", t.cluster},
        {"p_in_smem", t.p_in_smem}, {"dq_from_registers", t.dq_from_registers}, {"q_tiles_per_cta", t.q_tiles_per_cta},
        {"emulated_fraction", t.emulated_fraction}, {"rescale_frequency", t.rescale_frequency}}},
      {"schedule", m::name(schedule)},
      {"cycles", {{"mma", c.mma_cycles}, {"mufu", c.mufu_cycles}, {"alu", c.alu_cycles}, {"smem", c.smem_cycles}}},
      {"bound", m::name(c.bound)},
      {"bound_cycles", c.bound_cycles},
      {"serial_cycles", c.serial_cycles},
      {"alu_instructions", c.alu_instructions},
      {"smem_bytes",
       {{"operand", c.smem_operand_bytes}, {"staging", c.smem_staging_bytes}, {"exchange", c.smem_exchange_bytes},
        {"dq", c.smem_dq_bytes}}},
      {"tmem_bytes", c.tmem_bytes},
      {"load_bytes_per_step", c.load_bytes},
      {"step",
       {{"tensor_side", p.time.tensor_side}, {"softmax_side", p.time.softmax_side}, {"cycles", p.time.step},
        {"fill", p.time.fill}}},
      {"waves",
       {{"work_tiles", p.work_tiles}, {"units", p.units}, {"makespan_cycles", p.makespan_cycles},
        {"efficiency", p.wave_efficiency}}},
      {"flops", p.flops},
      {"compute_seconds", p.compute_seconds},
      {"work_tile_io",
       {{"prologue_bytes", c.prologue_bytes}, {"epilogue_bytes", c.epilogue_bytes},
        {"epilogue_smem_bytes", c.epilogue_smem_bytes}, {"cycles", p.io_cycles}}},
      {"hbm_bytes", p.hbm_bytes},
      {"hbm_seconds", p.hbm_seconds},
      {"aux_kernel_bytes", p.aux_bytes},
      {"aux_kernel_seconds", p.aux_seconds},
      {"tflops", p.tflops},
      {"tile_bound_tflops", p.tile_bound_tflops},
  };
}

void print_prediction_table(const ModelOptions& o, const m::Problem& problem) {
  const std::vector<Evaluated> evaluated = evaluate(o, problem);  // first: a bad option fails before any output
  fmt::print("fa4 model: {} {} d={}, batch {} x heads {}, seqlen {} x {}, {}{}\n", o.pass, o.dtype, o.d,
             problem.batch, problem.heads, problem.seqlen_q, problem.seqlen_k,
             problem.causal ? "causal" : "non-causal", problem.lpt ? ", longest-first" : "");
  fmt::print("per tile step, cycles by resource at peak rates; step = composed with the global efficiencies\n\n");
  fmt::print("{:<5} {:>9} {:>4} {:>5} {:>7} {:>8} | {:>6} {:>6} {:>6} {:>6} {:<5} {:>6} | {:>6} {:>5} {:>8} {:>8}\n",
             "gpu", "tile MxN", "ctas", "emu", "rescale", "schedule", "mma", "mufu", "alu", "smem", "bound", "serial",
             "step", "waves", "TFLOP/s", "tilebnd");
  for (const auto& [gpu, t, schedule, p] : evaluated) {
    const m::TileCost& c = p.tile;
    fmt::print("{:<5} {:>9} {:>4} {:>5.3f} {:>7.2f} {:>8} | {:>6.0f} {:>6.0f} {:>6.0f} {:>6.0f} {:<5} {:>6.0f} | "
               "{:>6.0f} {:>4.0f}% {:>8.0f} {:>8.0f}\n",
               m::name(gpu), fmt::format("{}x{}", t.m, t.n), t.ctas, t.emulated_fraction, t.rescale_frequency,
               m::name(schedule), c.mma_cycles, c.mufu_cycles, c.alu_cycles, c.smem_cycles, m::name(c.bound),
               c.serial_cycles, p.time.step, 100 * p.wave_efficiency, p.tflops, p.tile_bound_tflops);
  }
  fmt::print("\nshared-memory and tensor-memory bytes per tile step, global traffic\n");
  fmt::print("{:<5} | {:>8} {:>8} {:>8} {:>8} | {:>8} | {:>9} {:>9} | {:>9} {:>8} {:>8}\n", "gpu", "operand",
             "staging", "exchange", "dq", "tmem", "load/step", "tile io", "HBM MB", "HBM ms", "aux ms");
  for (const auto& [gpu, t, schedule, p] : evaluated) {
    const m::TileCost& c = p.tile;
    fmt::print("{:<5} | {:>8.0f} {:>8.0f} {:>8.0f} {:>8.0f} | {:>8.0f} | {:>9.0f} {:>9.0f} | {:>9.1f} {:>8.3f} {:>8.3f}\n",
               m::name(gpu), c.smem_operand_bytes, c.smem_staging_bytes, c.smem_exchange_bytes, c.smem_dq_bytes,
               c.tmem_bytes, c.load_bytes, p.io_cycles, p.hbm_bytes / 1e6, p.hbm_seconds * 1e3, p.aux_seconds * 1e3);
  }
  fmt::print("(tile io: cycles per backward work tile for its exposed prologue/epilogue; aux: pre/postprocess kernels)\n");
}

void run_validation(bool as_json) {
  const std::vector<m::ValidationRow> rows = m::validate_h200();
  if (as_json) {
    json out = json::array();
    for (const auto& r : rows)
      out.push_back({{"impl", r.measured.impl}, {"d", r.measured.d}, {"causal", r.measured.causal},
                     {"seqlen", r.measured.seqlen}, {"fwd_measured", r.measured.fwd_tflops},
                     {"fwd_predicted", r.fwd_predicted}, {"fwd_error", r.fwd_error},
                     {"bwd_measured", r.measured.bwd_tflops}, {"bwd_predicted", r.bwd_predicted},
                     {"bwd_error", r.bwd_error}});
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("model vs measured on our H200 (TFLOP/s, bf16, 16k tokens, heads = 2048/d; FA3 tile configurations)\n");
  fmt::print("{:<6} {:>4} {:>7} {:>6} | {:>5} {:>5} {:>7} | {:>5} {:>5} {:>7}\n", "impl", "d", "mask", "seqlen",
             "fwd", "model", "error", "bwd", "model", "error");
  for (const auto& r : rows) {
    fmt::print("{:<6} {:>4} {:>7} {:>6} | {:>5.0f} {:>5.0f} {:>+6.1f}% | {:>5.0f} {:>5.0f} {:>+6.1f}%\n",
               r.measured.impl, r.measured.d, r.measured.causal ? "causal" : "full", r.measured.seqlen,
               r.measured.fwd_tflops, r.fwd_predicted, 100 * r.fwd_error, r.measured.bwd_tflops, r.bwd_predicted,
               100 * r.bwd_error);
  }
}

void run_model(const ModelOptions& o) {
  if (o.validate) return run_validation(o.json);
  if (o.pass == "bwd" && (o.emulated_fraction || o.rescale_frequency))
    throw CLI::ValidationError("--emulated-fraction/--rescale-frequency", "apply to --pass fwd only");
  const m::Problem problem = problem_for(o);
  if (!o.json) return print_prediction_table(o, problem);
  json out{{"pass", o.pass}, {"dtype", o.dtype}, {"d", o.d}, {"batch", problem.batch}, {"heads", problem.heads},
           {"seqlen_q", problem.seqlen_q}, {"seqlen_k", problem.seqlen_k}, {"causal", problem.causal},
           {"lpt", problem.lpt}, {"results", json::array()}};
  for (const Evaluated& e : evaluate(o, problem)) out["results"].push_back(to_json(e));
  fmt::print("{}\n", out.dump(2));
}

}  // namespace

void add_model_command(CLI::App& app) {
  auto o = std::make_shared<ModelOptions>();
  CLI::App* cmd = app.add_subcommand(
      "model", "Feeds-and-speeds model: per-tile cycles by resource, bound, predicted TFLOP/s (H100/H200/B200/B300)");
  cmd->add_option("--gpu", o->gpu, "h100, h200, b200, b300 or all")
      ->check(CLI::IsMember({"h100", "h200", "b200", "b300", "all"}))
      ->capture_default_str();
  cmd->add_option("--pass", o->pass, "fwd or bwd")->check(CLI::IsMember({"fwd", "bwd"}))->capture_default_str();
  cmd->add_option("--d", o->d, "head dim")->check(CLI::Range(8, 256))->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "bf16, fp16 or fp8")
      ->check(CLI::IsMember({"bf16", "fp16", "fp8"}))
      ->capture_default_str();
  cmd->add_option("--tile-m", o->tile_m, "query rows per tile step (default: the reference kernel's)")
      ->check(CLI::Range(16, 512));
  cmd->add_option("--tile-n", o->tile_n, "key rows per tile step (default: the reference kernel's)")
      ->check(CLI::Range(16, 512));
  cmd->add_option("--seqlen", o->seqlen, "query sequence length")->check(CLI::Range(1, 1 << 22))->capture_default_str();
  cmd->add_option("--seqlen-k", o->seqlen_k, "key sequence length (default: --seqlen)")->check(CLI::Range(1, 1 << 22));
  cmd->add_option("--batch", o->batch, "batch (default: 16384 / seqlen)")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--heads", o->heads, "heads (default: 2048 / d)")->check(CLI::Range(1, 1024));
  cmd->add_flag("--causal", o->causal, "causal mask (bottom-right aligned)");
  cmd->add_option("--emulated-fraction", o->emulated_fraction, "forward exp2 fraction emulated on the FMA pipe")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--rescale-frequency", o->rescale_frequency, "forward fraction of steps that rescale O")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--ctas", o->ctas, "1 or 2 (2-CTA MMA, Blackwell only)")->check(CLI::IsMember({1, 2}));
  cmd->add_option("--cluster", o->cluster,
                  "1 or 2 (Hopper backward: a cluster pair sharing Q/dO by multicast, dQ summed through DSMEM)")
      ->check(CLI::IsMember({1, 2}));
  cmd->add_flag("--dq-from-registers", o->dq_from_registers,
               "Hopper backward: dQ partials added from registers, no SMEM staging (fa4's d = 128 row)");
  cmd->add_option("--schedule", o->schedule, "pingpong or serial (default: the reference kernel's)")
      ->check(CLI::IsMember({"pingpong", "serial"}));
  cmd->add_flag("--lpt", o->lpt, "longest-processing-time-first tile order");
  cmd->add_flag("--json", o->json, "print JSON to stdout");
  cmd->add_flag("--validate", o->validate, "compare with the FA3/cuDNN throughputs measured on our H200");
  cmd->callback([o] {
    // Bound the simulated work-tile count so the list scheduling stays instantaneous.
    const m::Problem p = problem_for(*o);
    if (static_cast<double>(p.batch) * p.heads * (static_cast<double>(std::max(p.seqlen_q, p.seqlen_k)) / 16) > 1e8)
      throw CLI::ValidationError("--batch/--heads/--seqlen", "problem too large to simulate (over 1e8 tiles)");
    try {
      run_model(*o);
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError("model", e.what());
    }
  });
}

}  // namespace fa4::cli
