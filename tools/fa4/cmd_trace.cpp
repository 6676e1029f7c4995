// `fa4 trace`: one attention call on the GPU with the kernel recording its own timeline (a trace build,
// -DFA4_TRACE=ON), written as a Perfetto trace-event JSON, an SVG timeline of a few CTAs, the raw trace, and a
// summary set beside `fa4 model`'s per-step prediction for the same shape.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include "fa4/commands.hpp"
#include "fa4/common.hpp"
#include "fa4/gpu.hpp"
#include "fa4/kvcache_inputs.hpp"
#include "model/model.hpp"
#include "trace/export.hpp"
#include "trace/trace.hpp"
#if FA4_WITH_CUDA
#include "cuda/trace/session.hpp"
#endif

namespace fa4::cli {
namespace {

using testing::HostTensor;

struct TraceArgs {
  ProblemArgs problem;
  std::vector<int64_t> kvcache;  // per-sequence keys already cached: a KV-cache call (kvcache_inputs.hpp)
  int64_t page_size = 0, append = -1;
  std::string pass = "fwd";
  bool deterministic = false;
  uint32_t capacity = 16384;
  std::string out_dir = "fa4-trace";
  std::vector<uint32_t> svg_ctas{0, 1};
};

#if FA4_WITH_CUDA
void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw Error(Status::invalid_argument, "fa4 trace: cannot write " + path.string());
}

// The consumers' measured time per step (a K/V tile in the forward, a query tile in the backward): their tile
// spans' total over the S issues inside them.
double measured_step_ns(const trace::Trace& t) {
  double tile_ns = 0;
  uint64_t steps = 0;
  for (uint32_t c = 0; c < t.ctas; ++c)
    for (uint32_t w = 0; w < t.writers_per_cta; ++w) {
      if (t.writer_names[w].rfind("consumer", 0) != 0) continue;
      uint64_t open = 0;
      for (const trace::Event& e : t.slice(c, w)) {
        const auto kind = static_cast<trace::Kind>(e.kind);
        if (kind == trace::Kind::tile_begin) open = e.t_ns;
        if (kind == trace::Kind::tile_end && open) tile_ns += double(e.t_ns - open), open = 0;
        if (kind == trace::Kind::s_issue) ++steps;
      }
    }
  return steps ? tile_ns / double(steps) : 0.0;
}

// fa4 model's step for this shape on the H200 (the kernels' target): the step time of the model's default
// tile for the pass, head dim and mask, in ns at the model's sustained clock.
std::string model_line(const ProblemArgs& pa, bool bwd, double measured_ns) {
  const model::Hardware& hw = model::hardware(model::Gpu::h200);
  const model::Pass pass = bwd ? model::Pass::bwd : model::Pass::fwd;
  const model::TileConfig tile =
      model::default_tile(model::Gpu::h200, pass, int(pa.head_dim), pa.causal,
                          pa.dtype == "f16" ? model::DType::fp16 : model::DType::bf16);
  const model::StepTime st = model::step_time(hw, model::tile_cost(hw, tile), model::default_schedule(model::Gpu::h200, pass));
  const double predicted_ns = st.step / hw.clock_ghz.value;
  return fmt::format("model     H200 step of a {}x{} tile (d {}): {:.0f} ns predicted; measured per consumer step "
                     "{:.0f} ns ({:.2f}x the prediction; the model's tile may differ from the kernel's, see the "
                     "kernel line)",
                     tile.m, tile.n, tile.d, predicted_ns, measured_ns,
                     predicted_ns > 0 ? measured_ns / predicted_ns : 0.0);
}

// One untraced call first (module load, caches; `warm`), then `call` traced: the trace of its last kernel.
trace::Trace record(const TraceArgs& a, const std::function<void()>& warm, const std::function<void()>& call) {
  warm();
  trace::arm(a.capacity);
  call();
  std::optional<trace::Trace> taken = trace::take_last();
  trace::disarm();
  if (!taken) throw Error(Status::internal, "fa4 trace: the call launched no traced kernel");
  return std::move(*taken);
}

// Writes the trace's files and prints its summary. exps: the exponentials the call computes (its visible
// query-key pairs); per16: the policy's emulated share of them.
void write_outputs(const TraceArgs& a, trace::Trace& t, const std::string& shape, bool bwd, double exps, int per16) {
  t.shape = shape;
  trace::validate(t);
  const std::filesystem::path dir(a.out_dir);
  std::filesystem::create_directories(dir);
  trace::write_trace(t, (dir / "trace.fa4trace").string());
  write_text(dir / "trace.json", trace::perfetto_json(t).dump());
  std::vector<uint32_t> ctas;
  for (uint32_t c : a.svg_ctas)
    if (c < t.ctas) ctas.push_back(c);
  write_text(dir / "timeline.svg", trace::timeline_svg(t, ctas));
  const trace::Summary summary = trace::summarize(t);
  const std::string model =
      fmt::format("exp2      {:.4g} elements: {:.4g} on MUFU, {:.4g} emulated on the FMA pipe ({}/16; the policy's "
                  "split, not counted by the kernel)\n",
                  exps, exps * (16 - per16) / 16.0, exps * per16 / 16.0, per16) +
      model_line(a.problem, bwd, measured_step_ns(t));
  write_text(dir / "summary.txt", trace::to_text(summary) + model + "\n");
  nlohmann::json sj = trace::to_json(summary);
  sj["model"] = model;
  write_text(dir / "summary.json", sj.dump(2));

  fmt::print("{}", trace::to_text(summary));
  fmt::print("{}\n", model);
  if (t.dropped() > 0)
    fmt::print("warning   {} events dropped: a writer's slice of {} events overflowed; rerun with a larger --capacity\n",
               t.dropped(), t.capacity);
  fmt::print("wrote     {}/{{trace.json (ui.perfetto.dev), timeline.svg, summary.txt, summary.json, trace.fa4trace}}\n",
             dir.string());
}

// `fa4 trace --kvcache ...`: the KV-cache forward (its append, if any, runs untraced before the traced kernel).
void run_kvcache_trace(const TraceArgs& a) {
  if (a.pass != "fwd" || a.deterministic)
    throw Error(Status::unsupported, "fa4 trace: --kvcache: a KV-cache call has only a forward (got --pass " + a.pass +
                                         (a.deterministic ? " --deterministic)" : ")"));
  const Options opts = a.problem.options();
  const KvCacheInputs in("fa4 trace", a.problem, a.kvcache, a.page_size, a.append);
  const KvCacheDevice dev(in);
  if (const Support s = dev.supports(opts); !s.ok) throw Error(Status::unsupported, "fa4 trace: " + s.reason);
  trace::Trace t = record(a, [&] { dev.call(opts); }, [&] { dev.call(opts); });
  const int per16 = int(std::lround(opts.exp2_emulated_fraction * 16.0f));
  write_outputs(a, t, "fwd " + in.problem_line(opts), false, in.flops(opts) / (4.0 * double(in.d)), per16);
}

void run_trace(const TraceArgs& a) {
  const ProblemArgs& pa = a.problem;
  if (const std::string why = gpu::unavailable_reason(); !why.empty())
    throw Error(Status::unsupported, "fa4 trace: needs a GPU: " + why);
  if (!trace::compiled_in())
    throw Error(Status::unsupported,
                "fa4 trace: this build does not record traces; configure a separate build with -DFA4_TRACE=ON, e.g. "
                "cmake -S . -B build-trace -DFA4_TRACE=ON && cmake --build build-trace --target fa4_cli");
  // The decode kernel (taken by default for a forward of one query over short key ranges where the forward kernel
  // would split the keys too) has no trace points: the forward kernel's decode row is what a trace of one query
  // shows, unless the caller chose with FA4_FWD_DECODE_KERNEL (a call that then runs on the decode kernel records
  // nothing, and says so).
  const int64_t queries = a.kvcache.empty() ? pa.sq() : (pa.seqlen_q >= 0 ? pa.seqlen_q : 1);  // kvcache_inputs.cpp
  const char* decode_kernel = std::getenv("FA4_FWD_DECODE_KERNEL");
  if ((decode_kernel == nullptr || *decode_kernel == '\0') && queries == 1 && a.pass != "bwd") {
    setenv("FA4_FWD_DECODE_KERNEL", "0", 1);
    fmt::print(stderr, "fa4 trace: one query: tracing the forward kernel (FA4_FWD_DECODE_KERNEL=0; the decode kernel "
                       "has no trace points)\n");
  }
  if (!a.kvcache.empty()) return run_kvcache_trace(a);
  const bool bwd = a.pass == "bwd";
  const DType dtype = parse_dtype(pa.dtype);
  const auto layout = parse_layout(pa.layout);
  Options opts = pa.options();
  opts.deterministic = a.deterministic;
  const Options bwd_opts = backward_options(opts);
  const std::array<int64_t, 4> qs{pa.batch, pa.sq(), pa.heads, pa.head_dim}, ks{pa.batch, pa.sk(), pa.hkv(), pa.head_dim};
  auto q = HostTensor::make(dtype, qs, layout), k = HostTensor::make(dtype, ks, layout),
       v = HostTensor::make(dtype, ks, layout), out = HostTensor::make(dtype, qs, layout), dout = HostTensor::make(dtype, qs, layout);
  auto lse = HostTensor::make_lse({pa.batch, pa.heads, pa.sq()});
  q.fill_normal(pa.seed * 7 + 1), k.fill_normal(pa.seed * 7 + 2), v.fill_normal(pa.seed * 7 + 3);
  dout.fill_normal(pa.seed * 7 + 4);
  out.poison(), lse.poison();
  const gpu::Mirror gq(q), gk(k), gv(v), gout(out), glse(lse), gdout(dout);
  const Support s = bwd ? supports(Pass::backward, gq.desc(), gk.desc(), gv.desc(), bwd_opts)
                        : supports(Pass::forward, gq.desc(), gk.desc(), gv.desc(), opts);
  if (!s.ok) throw Error(Status::unsupported, "fa4 trace: " + s.reason);
  auto dq = HostTensor::make(dtype, qs, layout), dk = HostTensor::make(dtype, ks, layout), dv = HostTensor::make(dtype, ks, layout);
  const gpu::Mirror gdq(dq), gdk(dk), gdv(dv);
  const gpu::Buffer ws(bwd ? workspace_size(Pass::backward, gq.desc(), gk.desc(), gv.desc(), bwd_opts) : 0);
  auto fwd_call = [&] { forward(gq.desc(), gk.desc(), gv.desc(), gout.desc(), &glse.desc(), opts); };
  auto bwd_call = [&] {
    backward(gq.desc(), gk.desc(), gv.desc(), gout.desc(), gdout.desc(), glse.desc(), gdq.desc(), gdk.desc(),
             gdv.desc(), bwd_opts, ws.workspace());
  };
  // The forward first either way (the backward reads its out and lse).
  trace::Trace t = record(a, [&] { fwd_call(); if (bwd) bwd_call(); }, [&] { bwd ? bwd_call() : fwd_call(); });
  // The exponentials by unit, from the policy the kernel ran (k/16 of the key columns emulated); the backward
  // recomputes P on MUFU only. Visible pairs: the masks' count.
  const double exps = attention_flops(pa.batch, pa.heads, pa.sq(), pa.sk(), pa.head_dim, opts, Pass::forward) /
                      (4.0 * double(pa.head_dim));
  const int per16 = bwd ? 0 : int(std::lround(opts.exp2_emulated_fraction * 16.0f));
  write_outputs(a, t,
                fmt::format("{} {}{}", bwd ? "bwd" : "fwd", pa.shape_string(), a.deterministic ? " deterministic" : ""),
                bwd, exps, per16);
}
#else
void run_trace(const TraceArgs&) {
  throw Error(Status::unsupported, "fa4 trace: this build has no CUDA backend (a GPU build configured with "
                                   "-DFA4_TRACE=ON records traces)");
}
#endif

}  // namespace

void add_trace_command(CLI::App& app) {
  auto args = std::make_shared<TraceArgs>();
  CLI::App* cmd = app.add_subcommand("trace", "record one GPU call's kernel timeline (a -DFA4_TRACE=ON build)");
  args->problem.add_to(cmd);
  cmd->add_option("--pass", args->pass, "fwd or bwd (the backward's main kernel)")
      ->check(CLI::IsMember({"fwd", "bwd"}))
      ->capture_default_str();
  cmd->add_flag("--deterministic", args->deterministic, "backward: dQ added in a fixed order");
  cmd->add_option("--capacity", args->capacity, "events kept per writer (a role of one CTA); more are counted as dropped")
      ->check(CLI::Range(1u, 1u << 24))
      ->capture_default_str();
  cmd->add_option("--out", args->out_dir, "directory for trace.json, timeline.svg, summary.*, trace.fa4trace")
      ->capture_default_str();
  cmd->add_option("--svg-ctas", args->svg_ctas, "CTAs drawn in timeline.svg")->delimiter(',')->capture_default_str();
  add_kvcache_options(cmd, args->kvcache, args->page_size, args->append);
  cmd->callback([args] { run_trace(*args); });
}

}  // namespace fa4::cli
