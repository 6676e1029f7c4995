// `fa4 bench`: a shape sweep, TFLOP/s table, JSON output (the bench/results schema), progress bar on a tty.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <functional>
#include <limits>
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
  int64_t heads_kv = 0;    // 0: = heads
  int64_t seqlen_q = 0;    // 0: = each seqlen (square); n: n queries against each seqlen of keys (1: decode)
  int64_t num_splits = 0;  // forward split-KV ranges (0: the backend's choice)
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
  const Options bwd_o = backward_options(o);
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
  const Support sup = supports(pass, first.q->desc(), first.k->desc(), first.v->desc(), pass == Pass::backward ? bwd_o : o);
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
  // The caller's workspace, allocated once and shared by the calls (as a caching allocator would hand out the same
  // block): the backward's accumulators, or the forward's split-KV partials.
  const gpu::Buffer ws(workspace_size(pass, first.q->desc(), first.k->desc(), first.v->desc(), bwd ? bwd_o : o));
  std::vector<std::function<void()>> calls;
  for (const auto& sp : sets) {
    const DeviceSet& s = *sp;
    if (bwd) {
      forward(s.q->desc(), s.k->desc(), s.v->desc(), s.out->desc(), &s.lse->desc(), o);  // O and LSE, untimed
      calls.push_back([&s, &bwd_o, &ws] {
        backward(s.q->desc(), s.k->desc(), s.v->desc(), s.out->desc(), s.dout->desc(), s.lse->desc(), s.dq->desc(),
                 s.dk->desc(), s.dv->desc(), bwd_o, ws.workspace());
      });
    } else {
      calls.push_back([&s, &o, &ws] {
        forward(s.q->desc(), s.k->desc(), s.v->desc(), s.out->desc(), &s.lse->desc(), o, ws.workspace());
      });
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
  fmt::print("{:<6} {:<5} {:>4} {:>7} {:>5} {:>5} {:<7} {:>11} {:>9}\n", "pass", "dtype", "d", "seqlen", "batch", "heads",
             "mask", "ms", "TFLOP/s");
  for (const auto& dt : a.dtypes)
    for (int64_t d : a.head_dims)
      for (int64_t s : a.seqlens)
        for (const auto& mask : a.masks) {
          const DType dtype = parse_dtype(dt);
          Options o;
          o.causal = mask == "causal";
          o.num_splits = int(std::min<int64_t>(a.num_splits, std::numeric_limits<int>::max()));
          const int64_t sq = a.seqlen_q > 0 ? a.seqlen_q : s, hkv = a.heads_kv > 0 ? a.heads_kv : a.heads;
          const std::array<int64_t, 4> qshape{a.batch, sq, a.heads, d}, kshape{a.batch, s, hkv, d};
          auto q = testing::HostTensor::make(dtype, qshape), k = testing::HostTensor::make(dtype, kshape),
               v = testing::HostTensor::make(dtype, kshape), out = testing::HostTensor::make(dtype, qshape),
               dout = testing::HostTensor::make(dtype, qshape), dq = testing::HostTensor::make(dtype, qshape),
               dk = testing::HostTensor::make(dtype, kshape), dv = testing::HostTensor::make(dtype, kshape);
          auto lse = testing::HostTensor::make_lse({a.batch, a.heads, sq});
          q.fill_normal(1), k.fill_normal(2), v.fill_normal(3), dout.fill_normal(4);
          for (const auto& pass_name : a.passes) {
            const Pass pass = pass_name == "fwd" ? Pass::forward : Pass::backward;
            progress.step(fmt::format("{} {} d={} s={} {}", pass_name, dt, d, s, mask));
            double sec = 0;
            if (cuda) {
              const auto timed = time_on_gpu(pass, o, q, k, v, out, lse, dout, dq, dk, dv, a.iters);
              if (!timed.ok) {
                fmt::print("{:<6} {:<5} {:>4} {:>7} {:>5} {:>5} {:<7} not run: {}\n", pass_name, dt, d, s, a.batch, a.heads,
                           mask, timed.reason);
                continue;
              }
              sec = timed.sec;
            } else {
              const Options bwd_o = backward_options(o);
              forward(q.desc(), k.desc(), v.desc(), out.desc(), &lse.desc(), o);  // O and LSE for the backward
              sec = median_seconds([&] {
                if (pass == Pass::forward)
                  forward(q.desc(), k.desc(), v.desc(), out.desc(), &lse.desc(), o);
                else
                  backward(q.desc(), k.desc(), v.desc(), out.desc(), dout.desc(), lse.desc(), dq.desc(), dk.desc(), dv.desc(),
                           bwd_o);
              }, a.iters);
            }
            const double tflops = attention_flops(a.batch, a.heads, sq, s, d, o, pass) / sec / 1e12;
            // A forward of one query per sequence is a decode row (issue 12's schema): its figure is the K/V
            // bytes streamed per second, not TFLOP/s.
            const bool decode = sq == 1 && pass == Pass::forward;
            const double kv_gbps = double(k.storage().size() + v.storage().size()) / sec / 1e9;
            fmt::print("{:<6} {:<5} {:>4} {:>7} {:>5} {:>5} {:<7} {:>11.3f} {:>9.4f}{}\n", decode ? "decode" : pass_name, dt, d,
                       sq == s ? fmt::format("{}", s) : fmt::format("{}x{}", sq, s), a.batch,
                       hkv == a.heads ? fmt::format("{}", a.heads) : fmt::format("{}/{}", a.heads, hkv), mask, sec * 1e3,
                       tflops, decode ? fmt::format("  {:.0f} GB/s of K/V", kv_gbps) : "");
            std::fflush(stdout);
            json row = {{"impl", cuda ? "fa4-cuda" : "fa4-cpu"}, {"dtype", dt}, {"d", d}, {"seqlen", s}, {"batch", a.batch},
                        {"heads", a.heads}, {"causal", o.causal}, {"pass", decode ? "decode" : pass_name},
                        {"tflops", tflops}, {"ms", sec * 1e3}};
            if (sq != s || hkv != a.heads || a.num_splits > 0)
              row.update({{"seqlen_q", sq}, {"seqlen_k", s}, {"heads_kv", hkv}, {"num_splits", a.num_splits}});
            if (decode) row.update({{"us", sec * 1e6}, {"gbps", kv_gbps}, {"page_size", 0}, {"seqlen_k", s}});
            rows.push_back(row);
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
  cmd->add_option("--heads-kv", a->heads_kv, "key/value heads (GQA/MQA; default: --heads)")->check(kAtLeastOne);
  cmd->add_option("--seqlen-q", a->seqlen_q,
                  "queries per sequence against each --seqlen of keys (default: square; 1: decode rows, K/V GB/s)")
      ->check(kAtLeastOne);
  cmd->add_option("--num-splits", a->num_splits, "forward split-KV ranges (0: the backend's choice)")
      ->check(kAtLeastZero)
      ->capture_default_str();
  cmd->add_option("--iters", a->iters, "timed iterations (median)")->check(kAtLeastOne)->capture_default_str();
  cmd->add_option("--json", a->json_path, "write results to this JSON file");
  cmd->add_option("--commit", a->commit, "commit id recorded in the JSON");
  cmd->add_option("--backend", a->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->callback([a] { bench(*a); });
}

}  // namespace fa4::cli
