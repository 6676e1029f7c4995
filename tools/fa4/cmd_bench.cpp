// `fa4 bench`: a shape sweep, TFLOP/s table, JSON output (the bench/results schema), progress bar on a tty.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "fa4/commands.hpp"
#include "fa4/common.hpp"
#include "fa4/gpu.hpp"
#include "api/device_info.hpp"

namespace fa4::cli {
namespace {

struct BenchArgs {
  std::vector<std::string> passes{"fwd", "bwd"};
  std::vector<std::string> dtypes{"f32", "bf16"};
  std::vector<int64_t> seqlens{1024, 4096};
  std::vector<int64_t> head_dims{64, 128};
  std::vector<std::string> masks{"none"};
  int64_t batch = 1, heads = 16;
  int iters = 3;
  std::string json_path, commit = "unknown";
  std::string backend = "cpu";
};

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

// One pass on the GPU, timed with CUDA events per call over rotating device copies of the inputs (DESIGN.md §5):
// as many sets, each with its own outputs, as make one round touch more than twice the L2, so that no call finds
// its inputs in L2. The backward's O and LSE come from one forward per set, outside the timing; its workspace,
// allocated once, is shared (as a caching allocator would hand out the same block). Not the peer benchmark:
// bench/gpu_bench.py times torch's SDPA and FlexAttention beside fa4 in one process.
struct GpuTiming {
  bool ok = false;
  std::string reason;  // why fa4::supports refused the pass
  double sec = 0;
};

GpuTiming time_on_gpu(Pass pass, const Options& o, const testing::HostTensor& q, const testing::HostTensor& k,
                      const testing::HostTensor& v, const testing::HostTensor& out, const testing::HostTensor& lse,
                      const testing::HostTensor& dout, const testing::HostTensor& dq, const testing::HostTensor& dk,
                      const testing::HostTensor& dv, int iters) {
  struct DeviceSet {
    std::unique_ptr<gpu::Mirror> q, k, v, out, lse, dout, dq, dk, dv;
  };
  const bool bwd = pass == Pass::backward;
  auto make_set = [&] {
    auto s = std::make_unique<DeviceSet>();
    s->q = std::make_unique<gpu::Mirror>(q), s->k = std::make_unique<gpu::Mirror>(k), s->v = std::make_unique<gpu::Mirror>(v);
    s->out = std::make_unique<gpu::Mirror>(out), s->lse = std::make_unique<gpu::Mirror>(lse);
    if (bwd) {
      s->dout = std::make_unique<gpu::Mirror>(dout), s->dq = std::make_unique<gpu::Mirror>(dq);
      s->dk = std::make_unique<gpu::Mirror>(dk), s->dv = std::make_unique<gpu::Mirror>(dv);
    }
    return s;
  };
  std::vector<std::unique_ptr<DeviceSet>> sets;
  sets.push_back(make_set());
  const DeviceSet& first = *sets.front();
  GpuTiming t;
  const Support sup = supports(pass, first.q->desc(), first.k->desc(), first.v->desc(), o);
  if (!sup.ok) {
    t.reason = sup.reason;
    return t;
  }
  std::size_t set_bytes = 0;
  for (const auto* h : {&q, &k, &v, &out, &lse}) set_bytes += h->storage().size();
  if (bwd)
    for (const auto* h : {&dout, &dq, &dk, &dv}) set_bytes += h->storage().size();
  const std::size_t l2 = gpu::l2_bytes() ? gpu::l2_bytes() : std::size_t(60) << 20;
  const std::size_t n_sets = std::max<std::size_t>(2, (2 * l2 + set_bytes - 1) / std::max<std::size_t>(set_bytes, 1) + 1);
  while (sets.size() < n_sets) sets.push_back(make_set());
  const gpu::Buffer ws(bwd ? workspace_size(Pass::backward, first.q->desc(), first.k->desc(), first.v->desc(), o) : 0);
  std::vector<std::function<void()>> calls;
  for (const auto& sp : sets) {
    const DeviceSet& s = *sp;
    if (bwd) {
      forward(s.q->desc(), s.k->desc(), s.v->desc(), s.out->desc(), &s.lse->desc(), o);  // O and LSE, untimed
      calls.push_back([&s, &o, &ws] {
        backward(s.q->desc(), s.k->desc(), s.v->desc(), s.out->desc(), s.dout->desc(), s.lse->desc(), s.dq->desc(),
                 s.dk->desc(), s.dv->desc(), o, ws.workspace());
      });
    } else {
      calls.push_back([&s, &o] { forward(s.q->desc(), s.k->desc(), s.v->desc(), s.out->desc(), &s.lse->desc(), o); });
    }
  }
  t.sec = gpu::median_ms(calls, iters) * 1e-3;
  t.ok = true;
  return t;
}

void bench(const BenchArgs& a) {
  using nlohmann::json;
  const bool cuda = a.backend == "cuda";
  if (cuda && !gpu::unavailable_reason().empty())
    throw Error(Status::unsupported, "fa4 bench: --backend cuda: " + gpu::unavailable_reason());
  json rows = json::array();
  const int total = static_cast<int>(a.passes.size() * a.dtypes.size() * a.seqlens.size() * a.head_dims.size() * a.masks.size());
  Progress progress("bench", total);
  fmt::print("{:<4} {:<5} {:>4} {:>7} {:>5} {:>5} {:<7} {:>11} {:>9}\n", "pass", "dtype", "d", "seqlen", "batch", "heads",
             "mask", "ms", "TFLOP/s");
  for (const auto& dt : a.dtypes)
    for (int64_t d : a.head_dims)
      for (int64_t s : a.seqlens)
        for (const auto& mask : a.masks) {
          const DType dtype = parse_dtype(dt);
          Options o;
          o.causal = mask == "causal";
          const std::array<int64_t, 4> shape{a.batch, s, a.heads, d};
          auto q = testing::HostTensor::make(dtype, shape), k = testing::HostTensor::make(dtype, shape),
               v = testing::HostTensor::make(dtype, shape), out = testing::HostTensor::make(dtype, shape),
               dout = testing::HostTensor::make(dtype, shape), dq = testing::HostTensor::make(dtype, shape),
               dk = testing::HostTensor::make(dtype, shape), dv = testing::HostTensor::make(dtype, shape);
          auto lse = testing::HostTensor::make_lse({a.batch, a.heads, s});
          q.fill_normal(1), k.fill_normal(2), v.fill_normal(3), dout.fill_normal(4);
          for (const auto& pass_name : a.passes) {
            const Pass pass = pass_name == "fwd" ? Pass::forward : Pass::backward;
            progress.step(fmt::format("{} {} d={} s={} {}", pass_name, dt, d, s, mask));
            double sec = 0;
            if (cuda) {
              const auto timed = time_on_gpu(pass, o, q, k, v, out, lse, dout, dq, dk, dv, a.iters);
              if (!timed.ok) {
                fmt::print("{:<4} {:<5} {:>4} {:>7} {:>5} {:>5} {:<7} not run: {}\n", pass_name, dt, d, s, a.batch, a.heads,
                           mask, timed.reason);
                continue;
              }
              sec = timed.sec;
            } else {
              forward(q.desc(), k.desc(), v.desc(), out.desc(), &lse.desc(), o);  // O and LSE for the backward
              sec = median_seconds([&] {
                if (pass == Pass::forward)
                  forward(q.desc(), k.desc(), v.desc(), out.desc(), &lse.desc(), o);
                else
                  backward(q.desc(), k.desc(), v.desc(), out.desc(), dout.desc(), lse.desc(), dq.desc(), dk.desc(), dv.desc(), o);
              }, a.iters);
            }
            const double tflops = attention_flops(a.batch, a.heads, s, s, d, o, pass) / sec / 1e12;
            fmt::print("{:<4} {:<5} {:>4} {:>7} {:>5} {:>5} {:<7} {:>11.3f} {:>9.4f}\n", pass_name, dt, d, s, a.batch, a.heads,
                       mask, sec * 1e3, tflops);
            std::fflush(stdout);
            rows.push_back({{"impl", cuda ? "fa4-cuda" : "fa4-cpu"}, {"dtype", dt}, {"d", d}, {"seqlen", s}, {"batch", a.batch},
                            {"heads", a.heads}, {"causal", o.causal}, {"pass", pass_name}, {"tflops", tflops},
                            {"ms", sec * 1e3}});
          }
        }
  if (!a.json_path.empty()) {
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    json doc = {{"commit", a.commit}, {"gpu", cuda ? json(detail::cuda_devices()[0].name) : json(nullptr)}, {"host", fmt::format("{} ({} threads)", cpu_model(), omp_get_max_threads())},
                {"date", date}, {"rows", rows}};
    std::ofstream(a.json_path) << doc.dump(2) << "\n";
    fmt::print("wrote {}\n", a.json_path);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "sweep shapes, print TFLOP/s, write JSON");
  cmd->add_option("--pass", a->passes, "fwd and/or bwd")->check(CLI::IsMember({"fwd", "bwd"}))->capture_default_str();
  cmd->add_option("--dtype", a->dtypes, "dtypes")->check(CLI::IsMember({"f32", "f16", "bf16"}))->capture_default_str();
  cmd->add_option("--seqlen", a->seqlens, "sequence lengths")->check(kAtLeastOne)->capture_default_str();
  cmd->add_option("--head-dim", a->head_dims, "head dims")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--mask", a->masks, "none and/or causal")->check(CLI::IsMember({"none", "causal"}))->capture_default_str();
  cmd->add_option("--batch", a->batch, "batch")->check(kAtLeastOne)->capture_default_str();
  cmd->add_option("--heads", a->heads, "heads")->check(kAtLeastOne)->capture_default_str();
  cmd->add_option("--iters", a->iters, "timed iterations (median)")->check(kAtLeastOne)->capture_default_str();
  cmd->add_option("--json", a->json_path, "write results to this JSON file");
  cmd->add_option("--commit", a->commit, "commit id recorded in the JSON");
  cmd->add_option("--backend", a->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->callback([a] { bench(*a); });
}

}  // namespace fa4::cli
