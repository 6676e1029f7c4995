// `fa4 run --kvcache L1,L2,... [--page-size P] [--append N] [--seqlen-q Q]`: one KV-cache call
// (fa4::forward_kvcache, FlashAttention's flash_attn_with_kvcache) on random inputs (kvcache_inputs.hpp: N keys
// appended per sequence, default its Q queries; pages shuffled; unfilled slots NaN). Runs on the GPU when it can
// (the metadata uploaded as an engine's are), else on the CPU; timed (each timed call appends the same keys at the
// same slots again); sampled rows of O checked against the fp64 reference over each sequence's keys.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "api/device_info.hpp"
#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "fa4/fa4.hpp"
#include "fa4/gpu.hpp"
#include "fa4/kvcache_inputs.hpp"
#include "fa4/run_common.hpp"

namespace fa4::cli {

using testing::HostTensor;

void run_kvcache(const RunArgs& a) {
  const char* cmd = "fa4 run";
  if (a.pass == "bwd" || a.pass == "both")
    throw Error(Status::unsupported, std::string(cmd) + ": --pass: expected fwd or auto with --kvcache (a KV-cache "
                                                        "call has no backward), got " + a.pass);
  const Options opts = a.problem.options();
  KvCacheInputs in(cmd, a.problem, a.kvcache, a.page_size, a.append);
  const int64_t batch = in.batch, h = in.h, hk = in.hk, d = in.d, sq = in.sq, append = in.append;
  const DType dtype = in.dtype;
  const KvCache kv = in.host_kv();

  std::string why = a.backend == "cpu" ? "requested" : gpu::unavailable_reason();
  std::unique_ptr<KvCacheDevice> dev;
  bool cuda = false;
  if (a.backend != "cpu" && why.empty()) {
    dev = std::make_unique<KvCacheDevice>(in);
    const Support s = dev->supports(opts);
    if (s.ok)
      cuda = true, why = detail::cuda_devices()[0].name;
    else
      why = s.reason;
  }
  if (a.backend == "cuda" && !cuda) throw Error(Status::unsupported, std::string(cmd) + ": --backend cuda: " + why);
  if (!cuda) {
    const Support s = supports_kvcache(in.q.desc(), in.kc.desc(), in.vc.desc(), kv, opts);
    if (!s.ok) throw Error(s.code, s.reason);
  }
  fmt::print("backend   {} ({})\n", cuda ? "cuda" : "cpu", why.empty() ? "no GPU" : why);
  fmt::print("problem   {}\n", in.problem_line(opts));

  const double flops = in.flops(opts);
  double sec = 0;
  if (cuda) {
    sec = gpu::median_ms([&] { dev->call(opts); }, a.iters) * 1e-3;
    dev->out->copy_to(in.out), dev->kc->copy_to(in.kc), dev->vc->copy_to(in.vc);
    // Host time per call (issue 12): the append (its own kernel unless the decode kernel does it), the attention
    // and (split) the combine launched, first with no workspace given (split partials in stream-ordered memory).
    // Repeating the call appends the same keys at the same slots.
    if (a.host_cost_calls > 0) {
      fmt::print("host      forward_kvcache {:8.2f} us per call ({} calls, not synchronized in between)\n",
                 gpu::host_us_per_call([&] { dev->call(opts); }, a.host_cost_calls),
                 a.host_cost_calls);
      // An engine sizes the workspace once and passes it (split-KV partials): no stream-ordered allocation.
      if (const size_t bytes = dev->workspace_bytes(opts); bytes > 0) {
        const gpu::Buffer ws(bytes);
        fmt::print("host      forward_kvcache {:8.2f} us per call ({} calls, not synchronized in between; caller's "
                   "workspace)\n",
                   gpu::host_us_per_call([&] { dev->call(opts, ws.workspace()); }, a.host_cost_calls),
                   a.host_cost_calls);
      }
    }
  } else {
    if (a.host_cost_calls > 0) fmt::print("host      not measured: on the CPU backend the call is the computation\n");
    sec = median_seconds(
        [&] { forward_kvcache(in.q.desc(), in.kc.desc(), in.vc.desc(), in.out.desc(), nullptr, kv, opts); }, a.iters);
  }
  print_timing("forward", sec, flops, a.iters);

  if (a.check_rows <= 0 || batch == 0 || h == 0 || sq == 0) {
    fmt::print("check     skipped\n");
    return;
  }
  // Sampled rows against the fp64 reference over the sequence's keys, gathered from the cache after the append.
  std::mt19937_64 rng(a.problem.seed);
  const int64_t row_bytes = hk * d * int64_t(element_size(dtype));
  const double tol = row_tolerance(dtype);
  double worst = 0;
  bool finite = true;
  std::vector<double> ref(size_t(d), 0.0);
  for (int r = 0; r < a.check_rows; ++r) {
    const int64_t b = r == 0 ? batch - 1 : int64_t(rng() % uint64_t(batch)), n = in.cached[size_t(b)] + append;
    const int64_t hh = int64_t(rng() % uint64_t(h)), i = r == 0 ? sq - 1 : int64_t(rng() % uint64_t(sq));
    auto kb = HostTensor::make(dtype, {1, std::max<int64_t>(n, 1), hk, d});
    auto vb = HostTensor::make(dtype, {1, std::max<int64_t>(n, 1), hk, d});
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(in.kc.storage().data() + in.slot(b, j) * row_bytes, row_bytes, kb.storage().data() + j * row_bytes);
      std::copy_n(in.vc.storage().data() + in.slot(b, j) * row_bytes, row_bytes, vb.storage().data() + j * row_bytes);
    }
    Tensor qs = in.q.desc(), ks = kb.desc(), vs = vb.desc();
    qs.data = in.q.storage().data() + b * sq * h * d * int64_t(element_size(dtype)), qs.shape[0] = 1;
    ks.shape[1] = vs.shape[1] = n;
    Options ref_opts = opts;
    ref_opts.num_splits = 0;
    const detail::Problem prob = detail::validate_inputs("fa4 run (reference)", qs, ks, vs, ref_opts);
    cpu::reference_forward_row(prob, qs, ks, vs, 0, hh, i, ref.data());
    worst = std::max(worst, row_error(in.out, b, i, hh, ref, finite));
  }
  print_check(finite && worst <= tol, fmt::format("O {:.2e} ({} sampled rows)", worst, a.check_rows), tol, finite);
}

}  // namespace fa4::cli
