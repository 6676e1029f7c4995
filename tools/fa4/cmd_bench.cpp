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
#include "fa4/run_common.hpp"
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
  // The forward's softmax policy, swept (issue 11's ablation): exp2 share on the FMA pipe (k/16) and tau.
  std::vector<float> emulated_fractions{0.0f};
  std::vector<float> taus{8.0f};
  std::vector<int64_t> varlen;  // per-sequence lengths of one variable-length batch (queries = keys); empty: dense
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

// `fa4 bench --varlen L1,L2,...`: one variable-length batch (sequence b: L_b queries, L_b keys) per dtype, head
// dim and mask through forward_varlen / backward_varlen, rows "fwd-varlen" / "bwd-varlen" with TFLOP/s over the
// sequences' own work (nothing for padding). On the GPU, rotating device copies as time_on_gpu's, the offsets
// on the device as an engine passes them.
void bench_varlen(const BenchArgs& a, nlohmann::json& rows) {
  const bool cuda = a.backend == "cuda";
  std::vector<int32_t> cu{0};
  for (int64_t n : a.varlen) {
    if (cu.back() + n > std::numeric_limits<int32_t>::max())
      throw Error(Status::invalid_argument, "fa4 bench: --varlen: expected lengths summing below 2^31");
    cu.push_back(cu.back() + int32_t(n));
  }
  const int64_t total = cu.back(), hkv = a.heads_kv > 0 ? a.heads_kv : a.heads;
  Varlen vl;
  vl.cu_seqlens_q = vl.cu_seqlens_k = cu.data();
  vl.batch = int64_t(a.varlen.size());
  vl.max_seqlen_q = vl.max_seqlen_k = *std::max_element(a.varlen.begin(), a.varlen.end());
  std::unique_ptr<gpu::Buffer> d_cu;
  Varlen dvl = vl;
  if (cuda) {
    d_cu = std::make_unique<gpu::Buffer>(cu.size() * sizeof(int32_t));
    d_cu->upload(cu.data(), cu.size() * sizeof(int32_t));
    dvl.cu_seqlens_q = dvl.cu_seqlens_k = static_cast<const int32_t*>(d_cu->data());
  }
  Progress progress("bench", static_cast<int>(a.passes.size() * a.dtypes.size() * a.head_dims.size() * a.masks.size()));
  std::string lens;
  for (size_t i = 0; i < a.varlen.size(); ++i) lens += fmt::format("{}{}", i ? "," : "", a.varlen[i]);
  for (const auto& dt : a.dtypes)
    for (int64_t d : a.head_dims)
      for (const auto& mask : a.masks) {
        const DType dtype = parse_dtype(dt);
        Options o;
        o.causal = mask == "causal";
        const Options bwd_o = backward_options(o);
        using testing::HostTensor;
        auto q = HostTensor::make(dtype, {1, total, a.heads, d}), k = HostTensor::make(dtype, {1, total, hkv, d}),
             v = HostTensor::make(dtype, {1, total, hkv, d}), out = HostTensor::make(dtype, {1, total, a.heads, d}),
             dout = HostTensor::make(dtype, {1, total, a.heads, d}), dq = HostTensor::make(dtype, {1, total, a.heads, d}),
             dk = HostTensor::make(dtype, {1, total, hkv, d}), dv = HostTensor::make(dtype, {1, total, hkv, d});
        auto lse = HostTensor::make_lse({1, a.heads, total});
        q.fill_normal(1), k.fill_normal(2), v.fill_normal(3), dout.fill_normal(4);
        struct Set {  // one call's tensors: packed views of host tensors or of their device mirrors
          std::vector<std::unique_ptr<gpu::Mirror>> mirrors;
          Tensor q, k, v, out, lse, dout, dq, dk, dv;
        };
        auto make_set = [&](bool on_gpu) {
          auto s = std::make_unique<Set>();
          auto view = [&](const HostTensor& h) {
            if (!on_gpu) return h.desc();
            s->mirrors.push_back(std::make_unique<gpu::Mirror>(h));
            return s->mirrors.back()->desc();
          };
          s->q = packed_view(view(q)), s->k = packed_view(view(k)), s->v = packed_view(view(v));
          s->out = packed_view(view(out)), s->lse = varlen_lse_view(view(lse)), s->dout = packed_view(view(dout));
          s->dq = packed_view(view(dq)), s->dk = packed_view(view(dk)), s->dv = packed_view(view(dv));
          return s;
        };
        std::vector<std::unique_ptr<Set>> sets;
        sets.push_back(make_set(cuda));
        if (cuda) {
          std::size_t set_bytes = 0;
          for (const auto* h : {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv}) set_bytes += h->storage().size();
          const std::size_t l2 = gpu::l2_bytes() ? gpu::l2_bytes() : std::size_t(60) << 20;
          while (sets.size() < std::max<std::size_t>(2, 2 * l2 / std::max<std::size_t>(set_bytes, 1) + 1))
            sets.push_back(make_set(true));
        }
        const Varlen& meta = cuda ? dvl : vl;
        const Set& first = *sets.front();
        // O and LSE for the backward, where the forward runs (else every pass of this shape is "not run").
        const Support fwd = supports_varlen(Pass::forward, first.q, first.k, first.v, meta, o);
        if (fwd.ok)
          for (const auto& s : sets) forward_varlen(s->q, s->k, s->v, s->out, &s->lse, meta, o);
        for (const auto& pass_name : a.passes) {
          const Pass pass = pass_name == "fwd" ? Pass::forward : Pass::backward;
          progress.step(fmt::format("{}-varlen {} d={} {}", pass_name, dt, d, mask));
          const Support sup =
              fwd.ok ? supports_varlen(pass, first.q, first.k, first.v, meta, pass == Pass::forward ? o : bwd_o) : fwd;
          if (!sup.ok) {
            fmt::print("{:<10} {:<5} {:>4} {:<7} not run: {}\n", pass_name + "-varlen", dt, d, mask, sup.reason);
            continue;
          }
          // The caller's workspace (the CUDA backward's), allocated once and shared by the calls.
          std::unique_ptr<gpu::Buffer> ws;
          if (cuda) ws = std::make_unique<gpu::Buffer>(workspace_size_varlen(pass, first.q, first.k, first.v, meta, bwd_o));
          const Workspace workspace = ws ? ws->workspace() : Workspace{};
          std::vector<std::function<void()>> calls;
          for (const auto& sp : sets) {
            const Set& s = *sp;
            calls.push_back([&s, &meta, &o, &bwd_o, workspace, pass] {
              if (pass == Pass::forward)
                forward_varlen(s.q, s.k, s.v, s.out, &s.lse, meta, o);
              else
                backward_varlen(s.q, s.k, s.v, s.out, s.dout, s.lse, s.dq, s.dk, s.dv, meta, bwd_o, workspace);
            });
          }
          const double sec = cuda ? gpu::median_ms(calls, a.iters) * 1e-3 : median_seconds(calls.front(), a.iters);
          double flops = 0;
          for (int64_t n : a.varlen) flops += attention_flops(1, a.heads, n, n, d, o, pass);
          const double tflops = sec > 0 ? flops / sec / 1e12 : 0.0;  // no work at all (every length 0): 0
          fmt::print("{:<10} {:<5} {:>4} {:<7} {:>11.3f} {:>9.4f}  ({} sequences, {} tokens)\n", pass_name + "-varlen", dt,
                     d, mask, sec * 1e3, tflops, a.varlen.size(), total);
          std::fflush(stdout);
          // bench/varlen_bench.py's fields for the same pass label (n_seqs, min/max/mean_len), and the lengths.
          rows.push_back({{"impl", cuda ? "fa4-cuda" : "fa4-cpu"}, {"dtype", dt}, {"d", d}, {"seqlen", vl.max_seqlen_q},
                          {"batch", vl.batch}, {"heads", a.heads}, {"heads_kv", hkv}, {"causal", o.causal},
                          {"pass", pass_name + "-varlen"}, {"lens", lens}, {"tokens", total}, {"n_seqs", vl.batch},
                          {"min_len", *std::min_element(a.varlen.begin(), a.varlen.end())},
                          {"max_len", vl.max_seqlen_q}, {"mean_len", (total + vl.batch / 2) / vl.batch},
                          {"tflops", tflops}, {"ms", sec * 1e3}});
        }
      }
}

// The dense sweep: every (dtype, head dim, seqlen, mask, pass).
void bench_dense(const BenchArgs& a, nlohmann::json& rows) {
  using nlohmann::json;
  const bool cuda = a.backend == "cuda";
  const int total = static_cast<int>(a.passes.size() * a.dtypes.size() * a.seqlens.size() * a.head_dims.size() *
                                     a.masks.size() * a.emulated_fractions.size() * a.taus.size());
  const bool ablation = a.emulated_fractions != std::vector<float>{0.0f} || a.taus != std::vector<float>{8.0f};
  Progress progress("bench", total);
  fmt::print("{:<6} {:<5} {:>4} {:>7} {:>5} {:>5} {:<7} {:>11} {:>9}\n", "pass", "dtype", "d", "seqlen", "batch", "heads",
             "mask", "ms", "TFLOP/s");
  for (const auto& dt : a.dtypes)
    for (int64_t d : a.head_dims)
      for (int64_t s : a.seqlens) {
        // The inputs depend on (dtype, head dim, seqlen) only: made and filled once for every mask and softmax
        // policy (filling them took most of an ablation's time).
        const DType dtype = parse_dtype(dt);
        const int64_t sq = a.seqlen_q > 0 ? a.seqlen_q : s, hkv = a.heads_kv > 0 ? a.heads_kv : a.heads;
        const std::array<int64_t, 4> qshape{a.batch, sq, a.heads, d}, kshape{a.batch, s, hkv, d};
        auto q = testing::HostTensor::make(dtype, qshape), k = testing::HostTensor::make(dtype, kshape),
             v = testing::HostTensor::make(dtype, kshape), out = testing::HostTensor::make(dtype, qshape),
             dout = testing::HostTensor::make(dtype, qshape), dq = testing::HostTensor::make(dtype, qshape),
             dk = testing::HostTensor::make(dtype, kshape), dv = testing::HostTensor::make(dtype, kshape);
        auto lse = testing::HostTensor::make_lse({a.batch, a.heads, sq});
        q.fill_normal(1), k.fill_normal(2), v.fill_normal(3), dout.fill_normal(4);
        for (const auto& mask : a.masks)
        for (float emulated : a.emulated_fractions)
        for (float tau : a.taus) {
          Options o;
          o.causal = mask == "causal";
          o.exp2_emulated_fraction = emulated;
          o.rescale_threshold = tau;
          const std::string policy = ablation ? fmt::format("  emu={:g} tau={:g}", emulated, tau) : "";
          o.num_splits = int(std::min<int64_t>(a.num_splits, std::numeric_limits<int>::max()));
          for (const auto& pass_name : a.passes) {
            const Pass pass = pass_name == "fwd" ? Pass::forward : Pass::backward;
            progress.step(fmt::format("{} {} d={} s={} {}{}", pass_name, dt, d, s, mask, policy));
            double sec = 0;
            if (cuda) {
              const auto timed = time_on_gpu(pass, o, q, k, v, out, lse, dout, dq, dk, dv, a.iters);
              if (!timed.ok) {
                fmt::print("{:<6} {:<5} {:>4} {:>7} {:>5} {:>5} {:<7} not run: {}{}\n", pass_name, dt, d, s, a.batch, a.heads,
                           mask, timed.reason, policy);
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
                       tflops, (decode ? fmt::format("  {:.0f} GB/s of K/V", kv_gbps) : "") + policy);
            std::fflush(stdout);
            json row = {{"impl", cuda ? "fa4-cuda" : "fa4-cpu"}, {"dtype", dt}, {"d", d}, {"seqlen", s}, {"batch", a.batch},
                        {"heads", a.heads}, {"causal", o.causal}, {"pass", decode ? "decode" : pass_name},
                        {"tflops", tflops}, {"ms", sec * 1e3}};
            if (sq != s || hkv != a.heads || a.num_splits > 0)
              row.update({{"seqlen_q", sq}, {"seqlen_k", s}, {"heads_kv", hkv}, {"num_splits", a.num_splits}});
            if (decode) row.update({{"us", sec * 1e6}, {"gbps", kv_gbps}, {"page_size", 0}, {"seqlen_k", s}});
            if (ablation) row.update({{"exp2_emulated_fraction", emulated}, {"rescale_threshold", tau}});
            rows.push_back(row);
          }
        }
      }
}

void bench(const BenchArgs& a) {
  using nlohmann::json;
  const bool cuda = a.backend == "cuda";
  const std::string no_gpu = gpu::unavailable_reason();
  if (cuda && !no_gpu.empty()) throw Error(Status::unsupported, "fa4 bench: --backend cuda: " + no_gpu);
  // The CPU backend is the default (its dtypes include f32, which the GPU kernels do not run): say so where a GPU
  // could have run the rows, so a GPU session does not time the CPU by accident.
  if (!cuda && no_gpu.empty())
    fmt::print(stderr, "fa4 bench: timing the CPU backend (the default); --backend cuda times the GPU\n");
  json rows = json::array();
  if (!a.varlen.empty()) {
    fmt::print("{:<10} {:<5} {:>4} {:<7} {:>11} {:>9}\n", "pass", "dtype", "d", "mask", "ms", "TFLOP/s");
    bench_varlen(a, rows);
  } else {
    bench_dense(a, rows);
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
  CLI::Option* varlen = cmd->add_option("--varlen", a->varlen,
                                        "one variable-length batch of these sequence lengths (queries = keys), "
                                        "instead of the dense sweep: rows fwd-varlen / bwd-varlen")
                            ->delimiter(',')
                            ->check(kAtLeastZero);
  // The batch and its lengths come from --varlen: these options would be ignored.
  for (const char* other : {"--seqlen", "--batch", "--seqlen-q", "--num-splits"}) varlen->excludes(other);
  cmd->add_option("--emulated-fraction", a->emulated_fractions,
                  "forward softmax: shares of exp2 on the FMA pipe, k/16 each (swept; issue 11's ablation)")
      ->capture_default_str()
      ->excludes(varlen);
  cmd->add_option("--tau", a->taus, "forward softmax: rescale thresholds in log2 units (swept)")
      ->capture_default_str()
      ->excludes(varlen);
  cmd->add_option("--iters", a->iters, "timed iterations (median)")->check(kAtLeastOne)->capture_default_str();
  cmd->add_option("--json", a->json_path, "write results to this JSON file");
  cmd->add_option("--commit", a->commit, "commit id recorded in the JSON");
  cmd->add_option("--backend", a->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->callback([a] { bench(*a); });
}

}  // namespace fa4::cli
