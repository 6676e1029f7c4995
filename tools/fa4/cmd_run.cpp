// `fa4 run`: one attention (forward, backward or both) on random inputs on the best available backend;
// prints backend, shape, time and TFLOP/s, and checks the outputs against the fp64 reference.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <utility>

#include "api/device_info.hpp"
#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "fa4/commands.hpp"
#include "fa4/common.hpp"
#include "fa4/gpu.hpp"
#include "fa4/kvcache_inputs.hpp"
#include "fa4/run_common.hpp"

namespace fa4::cli {
namespace {

using testing::HostTensor;


// The error of one gradient over its checked elements, relative to the largest reference entry among them.
struct GradError {
  double err = 0, scale = 0;
  int64_t count = 0;
  bool finite = true;
  void add(double ours, double ref) {
    finite = finite && std::isfinite(ours);
    err = std::max(err, std::fabs(ours - ref));
    scale = std::max(scale, std::fabs(ref));
    ++count;
  }
  double rel() const { return err / (scale > 0 ? scale : 1.0); }
};

// Above this many multiply-adds per slice (heads per kv head × s_q × s_k × d) the dK/dV check is left out: a
// slice is one head's whole fp64 backward on one core (about 5 of these per multiply-add).
constexpr double kSliceBudget = 2.2e9;

// dQ, dK and dV of whole (batch, kv head) slices against the fp64 reference backward (cpu::reference_backward)
// run on copies of those slices: a key's gradient needs the softmax of every query row, so the reference of a
// slice costs one head's whole backward; the slices run in parallel, one per thread.
void check_slices(const ProblemArgs& pa, DType dtype, const Options& opts, const HostTensor& q, const HostTensor& k,
                  const HostTensor& v, const HostTensor& dout, const HostTensor& dq, const HostTensor& dk,
                  const HostTensor& dv, const std::vector<std::pair<int64_t, int64_t>>& slices, GradError& eq,
                  GradError& ek, GradError& ev) {
  const int64_t n = static_cast<int64_t>(slices.size()), g = pa.heads / pa.hkv(), sq = pa.sq(), sk = pa.sk(),
                d = pa.head_dim;
  auto qs = HostTensor::make(dtype, {n, sq, g, d}), dos = HostTensor::make(dtype, {n, sq, g, d}),
       ks = HostTensor::make(dtype, {n, sk, 1, d}), vs = HostTensor::make(dtype, {n, sk, 1, d});
  for (int64_t s = 0; s < n; ++s) {
    const auto [b, hk] = slices[s];
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t hh = 0; hh < g; ++hh)
        for (int64_t c = 0; c < d; ++c) {
          qs.set({s, i, hh, c}, q.at({b, i, hk * g + hh, c}));
          dos.set({s, i, hh, c}, dout.at({b, i, hk * g + hh, c}));
        }
    for (int64_t j = 0; j < sk; ++j)
      for (int64_t c = 0; c < d; ++c) {
        ks.set({s, j, 0, c}, k.at({b, j, hk, c}));
        vs.set({s, j, 0, c}, v.at({b, j, hk, c}));
      }
  }
  const detail::Problem p = detail::validate_inputs("fa4 run (reference slices)", qs.desc(), ks.desc(), vs.desc(), opts);
  auto dq_ref = HostTensor::make(DType::f64, {n, sq, g, d}), dk_ref = HostTensor::make(DType::f64, {n, sk, 1, d}),
       dv_ref = HostTensor::make(DType::f64, {n, sk, 1, d});
  cpu::reference_backward(p, qs.desc(), ks.desc(), vs.desc(), dos.desc(), dq_ref.desc(), dk_ref.desc(), dv_ref.desc(),
                          cpu::Precision::exact);
  for (int64_t s = 0; s < n; ++s) {
    const auto [b, hk] = slices[s];
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t hh = 0; hh < g; ++hh)
        for (int64_t c = 0; c < d; ++c) eq.add(dq.at({b, i, hk * g + hh, c}), dq_ref.at({s, i, hh, c}));
    for (int64_t j = 0; j < sk; ++j)
      for (int64_t c = 0; c < d; ++c) {
        ek.add(dk.at({b, j, hk, c}), dk_ref.at({s, j, 0, c}));
        ev.add(dv.at({b, j, hk, c}), dv_ref.at({s, j, 0, c}));
      }
  }
}

// A rank-4 [1, rows, heads, d] view of rows [row0, row0 + rows) of a packed [1, total, heads, d] host tensor.
Tensor rows_of(const HostTensor& packed, int64_t row0, int64_t rows) {
  Tensor t = packed.desc();
  t.data = static_cast<std::byte*>(t.data) + row0 * t.stride[1] * int64_t(element_size(t.dtype));
  t.shape[1] = rows;
  return t;
}

// `fa4 run --varlen L1,L2,...`: one variable-length batch (sequence b has L_b queries and L_b keys) through
// forward_varlen / backward_varlen, timed, and sampled rows of O and dQ checked against the fp64 reference of
// their own sequence. The backend is the library's choice as for dense runs (the GPU where it runs the call).
void run_varlen(const RunArgs& a) {
  const ProblemArgs& pa = a.problem;
  const DType dtype = parse_dtype(pa.dtype);
  const Options opts = pa.options();
  const Options bwd_opts = backward_options(opts);
  const std::vector<int64_t>& lens = a.varlen;
  std::vector<int32_t> cu{0};
  for (int64_t n : lens) {
    if (cu.back() + n > std::numeric_limits<int32_t>::max())
      throw Error(Status::invalid_argument, "fa4 run: --varlen: expected lengths summing below 2^31");
    cu.push_back(cu.back() + int32_t(n));
  }
  const int64_t total = cu.back(), h = pa.heads, hk = pa.hkv(), d = pa.head_dim;
  auto q = HostTensor::make(dtype, {1, total, h, d}), k = HostTensor::make(dtype, {1, total, hk, d}),
       v = HostTensor::make(dtype, {1, total, hk, d}), out = HostTensor::make(dtype, {1, total, h, d});
  q.fill_normal(pa.seed * 7 + 1);
  k.fill_normal(pa.seed * 7 + 2);
  v.fill_normal(pa.seed * 7 + 3);
  out.poison();
  auto lse_host = HostTensor::make_lse({1, h, total});
  lse_host.poison();
  const Tensor lse = varlen_lse_view(lse_host.desc());
  Varlen vl;
  vl.cu_seqlens_q = vl.cu_seqlens_k = cu.data();
  vl.batch = int64_t(lens.size());
  vl.max_seqlen_q = vl.max_seqlen_k = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
  const Tensor q3 = packed_view(q), k3 = packed_view(k), v3 = packed_view(v), out3 = packed_view(out);

  // The GPU when it can run the forward (and the backward, with --pass bwd or both; with auto a backward it
  // cannot run is not run, saying why); the metadata go to the device as an engine's do.
  const bool require_bwd = a.pass == "bwd" || a.pass == "both";
  std::string why = a.backend == "cpu" ? "requested" : gpu::unavailable_reason();
  std::unique_ptr<gpu::Mirror> gq, gk, gv, gout, glse;
  std::unique_ptr<gpu::Buffer> gcu;
  Varlen gvl = vl;
  bool cuda = false;
  std::string no_cuda_bwd;  // why the GPU does not run the backward (empty: it does)
  if (a.backend != "cpu" && why.empty()) {
    gq = std::make_unique<gpu::Mirror>(q), gk = std::make_unique<gpu::Mirror>(k), gv = std::make_unique<gpu::Mirror>(v);
    gcu = std::make_unique<gpu::Buffer>(cu.size() * sizeof(int32_t));
    gcu->upload(cu.data(), cu.size() * sizeof(int32_t));
    gvl.cu_seqlens_q = gvl.cu_seqlens_k = static_cast<const int32_t*>(gcu->data());
    const Support fwd = supports_varlen(Pass::forward, packed_view(gq->desc()), packed_view(gk->desc()),
                                        packed_view(gv->desc()), gvl, opts);
    const Support bwd = supports_varlen(Pass::backward, packed_view(gq->desc()), packed_view(gk->desc()),
                                        packed_view(gv->desc()), gvl, bwd_opts);
    if (!fwd.ok)
      why = fwd.reason;
    else if (require_bwd && !bwd.ok)
      why = bwd.reason;
    else
      cuda = true, why = detail::cuda_devices()[0].name, no_cuda_bwd = bwd.ok ? "" : bwd.reason;
  }
  if (a.backend == "cuda" && !cuda) throw Error(Status::unsupported, "fa4 run: --backend cuda: " + why);
  if (cuda) {
    gout = std::make_unique<gpu::Mirror>(out), glse = std::make_unique<gpu::Mirror>(lse_host);
  } else {
    const Support fwd = supports_varlen(Pass::forward, q3, k3, v3, vl, opts);
    if (!fwd.ok) throw Error(fwd.code, fwd.reason);
  }
  const bool do_bwd = a.pass != "fwd" && (!cuda || no_cuda_bwd.empty());
  fmt::print("backend   {} ({})\n", cuda ? "cuda" : "cpu", why.empty() ? "no GPU" : why);
  if (cuda && a.pass == "auto" && !do_bwd) fmt::print("backward  not run on cuda: {}\n", no_cuda_bwd);
  std::string shape = fmt::format("varlen b={} total={} lens [", lens.size(), total);
  for (size_t i = 0; i < lens.size() && i < 8; ++i) shape += fmt::format("{}{}", i ? ", " : "", lens[i]);
  shape += lens.size() > 8 ? ", ...]" : "]";
  std::string mask = opts.causal ? " causal" : "";
  if (opts.window_left >= 0 || opts.window_right >= 0)
    mask += fmt::format(" window({},{})", opts.window_left, opts.window_right);
  fmt::print("problem   {} h={}/{} d={} {}{}\n", shape, h, hk, d, to_string(dtype), mask);

  double fl_fwd = 0, fl_bwd = 0;
  for (int64_t n : lens) {
    fl_fwd += attention_flops(1, h, n, n, d, opts, Pass::forward);
    fl_bwd += attention_flops(1, h, n, n, d, opts, Pass::backward);
  }
  double fsec = 0;
  if (cuda) {
    const Tensor glse_view = varlen_lse_view(glse->desc());
    fsec = gpu::median_ms([&] {
      forward_varlen(packed_view(gq->desc()), packed_view(gk->desc()), packed_view(gv->desc()),
                     packed_view(gout->desc()), &glse_view, gvl, opts);
    }, a.iters) * 1e-3;
    gout->copy_to(out), glse->copy_to(lse_host);
  } else {
    fsec = median_seconds([&] { forward_varlen(q3, k3, v3, out3, &lse, vl, opts); }, a.iters);
  }
  if (a.pass != "bwd")
    print_timing("forward", fsec, fl_fwd, a.iters);
  HostTensor dout, dq, dk, dv;
  if (do_bwd) {
    dout = HostTensor::make(dtype, {1, total, h, d});
    dout.fill_normal(pa.seed * 7 + 4);
    dq = HostTensor::make(dtype, {1, total, h, d}), dk = HostTensor::make(dtype, {1, total, hk, d}),
    dv = HostTensor::make(dtype, {1, total, hk, d});
    for (auto* t : {&dq, &dk, &dv}) t->poison();
    double bsec = 0;
    if (cuda) {
      const gpu::Mirror gdout(dout), gdq(dq), gdk(dk), gdv(dv);
      const Tensor glse_view = varlen_lse_view(glse->desc());
      bsec = gpu::median_ms([&] {
        backward_varlen(packed_view(gq->desc()), packed_view(gk->desc()), packed_view(gv->desc()),
                        packed_view(gout->desc()), packed_view(gdout.desc()), glse_view, packed_view(gdq.desc()),
                        packed_view(gdk.desc()), packed_view(gdv.desc()), gvl, bwd_opts);
      }, a.iters) * 1e-3;
      gdq.copy_to(dq), gdk.copy_to(dk), gdv.copy_to(dv);
    } else {
      bsec = median_seconds([&] {
        backward_varlen(q3, k3, v3, out3, packed_view(dout), lse, packed_view(dq), packed_view(dk), packed_view(dv),
                        vl, bwd_opts);
      }, a.iters);
    }
    print_timing("backward", bsec, fl_bwd, a.iters);
  }

  std::vector<int64_t> nonempty;
  for (size_t b = 0; b < lens.size(); ++b)
    if (lens[b] > 0) nonempty.push_back(int64_t(b));
  if (a.check_rows <= 0 || nonempty.empty() || h == 0) {
    fmt::print("check     skipped\n");
    return;
  }
  // Sampled rows of O (and dQ) against the fp64 reference of their own sequence, as a dense batch of one.
  std::mt19937_64 rng(pa.seed);
  const double tol = row_tolerance(dtype);
  double worst_o = 0;
  GradError eq;
  bool finite = true;
  std::vector<double> ref(static_cast<size_t>(d), 0.0);
  for (int r = 0; r < a.check_rows; ++r) {
    const int64_t b = nonempty[r == 0 ? nonempty.size() - 1 : rng() % nonempty.size()], n = lens[size_t(b)];
    const int64_t hh = rng() % h, i = r == 0 ? n - 1 : int64_t(rng() % uint64_t(n)), row0 = cu[size_t(b)];
    const Tensor qs = rows_of(q, row0, n), ks = rows_of(k, row0, n), vs = rows_of(v, row0, n);
    const detail::Problem prob = detail::validate_inputs("fa4 run (reference)", qs, ks, vs, opts);
    cpu::reference_forward_row(prob, qs, ks, vs, 0, hh, i, ref.data());
    worst_o = std::max(worst_o, row_error(out, 0, row0 + i, hh, ref, finite));
    if (do_bwd) {
      cpu::reference_backward_dq_row(prob, qs, ks, vs, rows_of(dout, row0, n), 0, hh, i, ref.data());
      for (int64_t c = 0; c < d; ++c) eq.add(dq.at({0, row0 + i, hh, c}), ref[size_t(c)]);
    }
  }
  finite = finite && eq.finite;
  const bool ok = finite && worst_o <= tol && (!do_bwd || eq.rel() <= tol);
  std::string what = fmt::format("O {:.2e} ({} sampled rows)", worst_o, a.check_rows);
  if (do_bwd) what += fmt::format(", dQ {:.2e} (the same rows)", eq.rel());
  print_check(ok, what, tol, finite);
}

void run(const RunArgs& a) {
  if (!a.kvcache.empty()) {
    run_kvcache(a);
    return;
  }
  if (!a.varlen.empty()) {
    run_varlen(a);
    return;
  }
  const ProblemArgs& pa = a.problem;
  const DType dtype = parse_dtype(pa.dtype);
  const auto layout = parse_layout(pa.layout);
  const Options opts = pa.options();
  const Options bwd_opts = backward_options(opts);
  const std::array<int64_t, 4> qs{pa.batch, pa.sq(), pa.heads, pa.head_dim}, ks{pa.batch, pa.sk(), pa.hkv(), pa.head_dim};
  auto q = HostTensor::make(dtype, qs, layout), k = HostTensor::make(dtype, ks, layout),
       v = HostTensor::make(dtype, ks, layout), out = HostTensor::make(dtype, qs, layout);
  auto lse = HostTensor::make_lse({pa.batch, pa.heads, pa.sq()});
  q.fill_normal(pa.seed * 7 + 1);
  k.fill_normal(pa.seed * 7 + 2);
  v.fill_normal(pa.seed * 7 + 3);
  out.poison();
  lse.poison();
  const detail::Problem prob = detail::validate_inputs("fa4 run", q.desc(), k.desc(), v.desc(), opts);
  const bool require_bwd = a.pass == "bwd" || a.pass == "both";

  // The best available backend: the GPU when its kernels run every requested pass of this problem.
  Device device = Device::cpu;
  std::string why = a.backend == "cpu" ? "requested" : gpu::unavailable_reason();
  std::unique_ptr<gpu::Mirror> gq, gk, gv, gout, glse;  // device copies
  Support gpu_bwd;
  if (a.backend != "cpu" && why.empty()) {
    gq = std::make_unique<gpu::Mirror>(q), gk = std::make_unique<gpu::Mirror>(k), gv = std::make_unique<gpu::Mirror>(v);
    const Support fwd = supports(Pass::forward, gq->desc(), gk->desc(), gv->desc(), opts);
    gpu_bwd = supports(Pass::backward, gq->desc(), gk->desc(), gv->desc(), bwd_opts);
    if (!fwd.ok)
      why = fwd.reason;
    else if (require_bwd && !gpu_bwd.ok)
      why = gpu_bwd.reason;
    else
      device = Device::cuda, why = detail::cuda_devices()[0].name;
  }
  if (a.backend == "cuda" && device != Device::cuda) throw Error(Status::unsupported, "fa4 run: --backend cuda: " + why);
  const bool cuda = device == Device::cuda;
  if (cuda) gout = std::make_unique<gpu::Mirror>(out), glse = std::make_unique<gpu::Mirror>(lse);
  fmt::print("backend   {} ({})\n", to_string(device), why);
  fmt::print("problem   {}\n", pa.shape_string());
  const bool do_bwd = a.pass != "fwd" && (!cuda || gpu_bwd.ok);
  if (cuda && a.pass == "auto" && !gpu_bwd.ok) fmt::print("backward  not run on cuda: {}\n", gpu_bwd.reason);
  {  // the forward always runs: the backward needs its O and LSE
    const double sec =
        cuda ? gpu::median_ms([&] { forward(gq->desc(), gk->desc(), gv->desc(), gout->desc(), &glse->desc(), opts); },
                              a.iters) * 1e-3
             : median_seconds([&] { forward(q.desc(), k.desc(), v.desc(), out.desc(), &lse.desc(), opts); }, a.iters);
    if (cuda) gout->copy_to(out), glse->copy_to(lse);
    const double fl = attention_flops(pa.batch, pa.heads, pa.sq(), pa.sk(), pa.head_dim, opts, Pass::forward);
    if (a.pass != "bwd") print_timing("forward", sec, fl, a.iters);
  }
  if (a.host_cost_calls > 0) {
    // Host time per call (issue 12: an engine's CPU thread pays this per attention call): on the GPU backend the
    // library's launch path; on the CPU backend the call is the computation, so there is nothing separate to time.
    if (cuda) {
      fmt::print("host      forward {:8.2f} us per call ({} calls, not synchronized in between)\n",
                 gpu::host_us_per_call([&] { forward(gq->desc(), gk->desc(), gv->desc(), gout->desc(), &glse->desc(), opts); },
                                       a.host_cost_calls),
                 a.host_cost_calls);
      // An engine sizes the workspace once and passes it (split-KV partials): no stream-ordered allocation.
      if (const size_t bytes = workspace_size(Pass::forward, gq->desc(), gk->desc(), gv->desc(), opts); bytes > 0) {
        const gpu::Buffer ws(bytes);
        fmt::print("host      forward {:8.2f} us per call ({} calls, not synchronized in between; caller's workspace)\n",
                   gpu::host_us_per_call([&] { forward(gq->desc(), gk->desc(), gv->desc(), gout->desc(), &glse->desc(), opts,
                                                       ws.workspace()); },
                                         a.host_cost_calls),
                   a.host_cost_calls);
      }
    } else
      fmt::print("host      not measured: on the CPU backend the call is the computation\n");
  }
  HostTensor dout, dq, dk, dv;
  if (do_bwd) {
    dout = HostTensor::make(dtype, qs, layout);
    dout.fill_normal(pa.seed * 7 + 4);
    dq = HostTensor::make(dtype, qs, layout), dk = HostTensor::make(dtype, ks, layout), dv = HostTensor::make(dtype, ks, layout);
    for (auto* t : {&dq, &dk, &dv}) t->poison();
    double sec = 0;
    if (cuda) {  // on the device O and LSE of the forward above; gradients and workspace NaN-poisoned
      const gpu::Mirror gdout(dout), gdq(dq), gdk(dk), gdv(dv);
      const gpu::Buffer ws(workspace_size(Pass::backward, gq->desc(), gk->desc(), gv->desc(), bwd_opts));
      const auto call = [&] {
        backward(gq->desc(), gk->desc(), gv->desc(), gout->desc(), gdout.desc(), glse->desc(), gdq.desc(), gdk.desc(),
                 gdv.desc(), bwd_opts, ws.workspace());
      };
      sec = gpu::median_ms(call, a.iters) * 1e-3;
      if (a.host_cost_calls > 0)
        fmt::print("host      backward {:7.2f} us per call ({} calls, not synchronized in between; caller's workspace)\n",
                   gpu::host_us_per_call(call, a.host_cost_calls), a.host_cost_calls);
      gdq.copy_to(dq), gdk.copy_to(dk), gdv.copy_to(dv);
    } else {
      sec = median_seconds([&] {
        backward(q.desc(), k.desc(), v.desc(), out.desc(), dout.desc(), lse.desc(), dq.desc(), dk.desc(), dv.desc(), bwd_opts);
      }, a.iters);
    }
    const double fl = attention_flops(pa.batch, pa.heads, pa.sq(), pa.sk(), pa.head_dim, opts, Pass::backward);
    print_timing("backward", sec, fl, a.iters);
  }

  // Spot check against the fp64 reference: sampled rows of O and dQ; with a backward also dQ, dK and dV of whole
  // (batch, kv head) slices where their reference is affordable.
  if (a.check_rows <= 0 || pa.batch * pa.heads * pa.sq() == 0) {
    fmt::print("check     skipped\n");
    return;
  }
  std::mt19937_64 rng(pa.seed);
  const double tol = row_tolerance(dtype);
  double worst_o = 0;
  GradError eq_rows, eq, ek, ev;
  bool finite = true;
  std::vector<double> ref(pa.head_dim);
  for (int r = 0; r < a.check_rows; ++r) {
    const int64_t b = rng() % pa.batch, h = rng() % pa.heads, i = r == 0 ? pa.sq() - 1 : rng() % pa.sq();
    cpu::reference_forward_row(prob, q.desc(), k.desc(), v.desc(), b, h, i, ref.data());
    worst_o = std::max(worst_o, row_error(out, b, i, h, ref, finite));
    if (do_bwd) {
      cpu::reference_backward_dq_row(prob, q.desc(), k.desc(), v.desc(), dout.desc(), b, h, i, ref.data());
      for (int64_t c = 0; c < pa.head_dim; ++c) eq_rows.add(dq.at({b, i, h, c}), ref[c]);
    }
  }
  const int64_t group = pa.heads / pa.hkv();
  const double slice_cost = static_cast<double>(group) * pa.sq() * pa.sk() * pa.head_dim;
  const bool slices_checked = do_bwd && pa.sk() > 0 && slice_cost <= kSliceBudget;
  int64_t n_slices = 0;
  if (slices_checked) {
    // The last (batch, kv head) and random others, as many as there are threads (at most 8).
    const int64_t total = pa.batch * pa.hkv();
    n_slices = std::min<int64_t>({total, std::max(1, omp_get_max_threads()), 8});
    std::set<std::pair<int64_t, int64_t>> chosen{{pa.batch - 1, pa.hkv() - 1}};
    while (static_cast<int64_t>(chosen.size()) < n_slices) chosen.insert({int64_t(rng() % pa.batch), int64_t(rng() % pa.hkv())});
    const std::vector<std::pair<int64_t, int64_t>> slices(chosen.begin(), chosen.end());
    check_slices(pa, dtype, bwd_opts, q, k, v, dout, dq, dk, dv, slices, eq, ek, ev);
  } else if (do_bwd && pa.sk() > 0) {
    fmt::print("check     dK, dV not checked: the fp64 reference of one (batch, kv head) slice is {:.1e} multiply-adds "
               "here (limit {:.1e}); a shorter --seqlen checks them\n", 5 * slice_cost, 5 * kSliceBudget);
  }
  for (const GradError* e : {&eq_rows, &eq, &ek, &ev}) finite = finite && e->finite;
  const double worst_dq = std::max(eq_rows.rel(), eq.rel());
  const bool ok = finite && worst_o <= tol && (!do_bwd || (worst_dq <= tol && ek.rel() <= tol && ev.rel() <= tol));
  std::string what = fmt::format("O {:.2e} ({} sampled rows)", worst_o, a.check_rows);
  if (do_bwd) what += fmt::format(", dQ {:.2e} ({} sampled rows{})", worst_dq, a.check_rows,
                                  slices_checked ? fmt::format(" and {} slices", n_slices) : "");
  if (slices_checked)
    what += fmt::format(", dK {:.2e}, dV {:.2e} ({} whole (batch, kv head) slices)", ek.rel(), ev.rel(), n_slices);
  print_check(ok, what, tol, finite);
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "run one attention on random inputs, time it and spot-check it");
  args->problem.add_to(cmd);
  cmd->add_option("--pass", args->pass, "fwd, bwd, both, or auto (forward, and backward where the backend has one)")
      ->check(CLI::IsMember({"auto", "fwd", "bwd", "both"}))
      ->capture_default_str();
  cmd->add_option("--backend", args->backend, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--iters", args->iters, "timed iterations (median reported)")->check(kAtLeastOne)->capture_default_str();
  cmd->add_option("--check-rows", args->check_rows, "rows checked against the reference (0: no check)")->check(kAtLeastZero)->capture_default_str();
  cmd->add_option("--host-cost", args->host_cost_calls,
                  "also time the host side of N back-to-back unsynchronized calls (GPU backend; 0: off)")
      ->check(kAtLeastZero);
  CLI::Option* varlen = cmd->add_option("--varlen", args->varlen,
                                        "a variable-length batch: the sequences' lengths, comma-separated (queries "
                                        "= keys; packed without padding)")
                            ->delimiter(',')
                            ->check(kAtLeastZero);
  // The batch and its lengths come from --varlen, its layout is the packed one: those options would be ignored.
  for (const char* other : {"--batch", "--seqlen", "--seqlen-q", "--seqlen-k", "--layout"}) varlen->excludes(other);
  CLI::Option* kvcache = add_kvcache_options(cmd, args->kvcache, args->page_size, args->append);
  kvcache->excludes(varlen);
  cmd->callback([args] { run(*args); });
}

}  // namespace fa4::cli
