#include "testing/tolerance.hpp"

#include <cmath>
#include <sstream>

#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "numerics/convert.hpp"

namespace fa4::testing {
namespace {

double round_to(DType dtype, double x) {
  switch (dtype) {
    case DType::bf16: return num::round_to_bf16(static_cast<float>(x));
    case DType::f16: return num::round_to_f16(static_cast<float>(x));
    case DType::f32: return static_cast<float>(x);
    case DType::f64: return x;
  }
  return x;
}

}  // namespace

std::string Comparison::summary() const {
  std::ostringstream s;
  s << "max_err " << max_error << " vs bound " << bound << " (naive " << baseline << ", atol " << atol << ")";
  if (mismatched_nonfinite) s << ", " << mismatched_nonfinite << " non-finite mismatches";
  return s.str();
}

Comparison compare(const std::vector<double>& ours, const std::vector<double>& ref, const std::vector<double>& naive,
                   DType dtype, double rtol, double extra_atol) {
  Comparison c;
  double ulp_term = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i];
    if (!std::isfinite(r) || !std::isfinite(ours[i])) {
      if (!(r == ours[i])) ++c.mismatched_nonfinite;  // -inf LSE of a masked row must match exactly
      continue;
    }
    c.max_error = std::max(c.max_error, std::fabs(ours[i] - r));
    if (std::isfinite(naive[i])) c.baseline = std::max(c.baseline, std::fabs(naive[i] - r));
    const double rr = round_to(dtype, r);
    ulp_term = std::max(ulp_term, std::fabs(round_to(dtype, round_to(dtype, rr + 0.3) - 0.3) - rr));
  }
  c.atol = 2 * ulp_term + extra_atol;
  c.bound = rtol * c.baseline + c.atol;
  c.pass = c.mismatched_nonfinite == 0 && c.max_error <= c.bound;
  return c;
}

std::string CaseSpec::name() const {
  std::ostringstream s;
  s << to_string(dtype) << " b" << batch << " sq" << seqlen_q << " sk" << seqlen_k << " h" << heads_q << "/" << heads_kv
    << " d" << head_dim;
  if (options.causal) s << " causal";
  if (options.window_left >= 0 || options.window_right >= 0)
    s << " window(" << options.window_left << "," << options.window_right << ")";
  if (options.softcap > 0) s << " softcap" << options.softcap;
  if (options.exp2_emulated_fraction > 0) s << " emu" << options.exp2_emulated_fraction;
  if (options.rescale_threshold != 8.0f) s << " tau" << options.rescale_threshold;
  if (layout == Layout::bhsd) s << " bhsd";
  if (broadcast_kv) s << " kv-broadcast";
  return s.str();
}

CaseInputs make_case_inputs(const CaseSpec& spec) {
  const std::array<int64_t, 4> qshape{spec.batch, spec.seqlen_q, spec.heads_q, spec.head_dim};
  const std::array<int64_t, 4> kshape{spec.batch, spec.seqlen_k, spec.heads_kv, spec.head_dim};
  const std::array<int64_t, 4> kstore{spec.batch, spec.seqlen_k, spec.broadcast_kv ? 1 : spec.heads_kv, spec.head_dim};
  CaseInputs in{HostTensor::make(spec.dtype, qshape, spec.layout), HostTensor::make(spec.dtype, kstore, spec.layout),
                HostTensor::make(spec.dtype, kstore, spec.layout), HostTensor::make(spec.dtype, qshape, spec.layout)};
  in.q.fill_normal(spec.seed * 7 + 1, spec.options.softcap > 0 ? spec.options.softcap / 4 : 1.0);
  in.k.fill_normal(spec.seed * 7 + 2);
  in.v.fill_normal(spec.seed * 7 + 3);
  in.dout.fill_normal(spec.seed * 7 + 4);
  in.kv_storage_elems = in.k.numel();
  if (spec.broadcast_kv) {  // stride 0 over heads: every kv head reads the same memory
    for (auto* t : {&in.k, &in.v}) {
      t->desc().shape = kshape;
      t->desc().stride[2] = 0;
    }
  }
  return in;
}

CaseResult run_case(const CaseSpec& spec, Executor* executor) {
  const std::array<int64_t, 4> qshape{spec.batch, spec.seqlen_q, spec.heads_q, spec.head_dim};
  const std::array<int64_t, 4> kshape{spec.batch, spec.seqlen_k, spec.heads_kv, spec.head_dim};
  CaseInputs in = make_case_inputs(spec);
  HostTensor &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  auto out = HostTensor::make(spec.dtype, qshape, spec.layout);
  auto lse = HostTensor::make_lse({spec.batch, spec.heads_q, spec.seqlen_q});
  out.poison();
  lse.poison();
  if (executor)
    executor->forward(q, k, v, out, lse, spec.options);
  else
    forward(q.desc(), k.desc(), v.desc(), out.desc(), &lse.desc(), spec.options);

  const detail::Problem p = detail::validate_inputs("fa4::testing", q.desc(), k.desc(), v.desc(), spec.options);
  auto out_ref = HostTensor::make(DType::f64, qshape), out_naive = HostTensor::make(DType::f64, qshape);
  auto lse_ref = HostTensor::make_lse({spec.batch, spec.heads_q, spec.seqlen_q});
  auto lse_naive = HostTensor::make_lse({spec.batch, spec.heads_q, spec.seqlen_q});
  cpu::reference_forward(p, q.desc(), k.desc(), v.desc(), out_ref.desc(), &lse_ref.desc(), cpu::Precision::exact);
  cpu::reference_forward(p, q.desc(), k.desc(), v.desc(), out_naive.desc(), &lse_naive.desc(), cpu::Precision::storage);

  const double rtol = spec.options.softcap > 0 ? 3.0 : 2.0;
  CaseResult r;
  r.out = compare(out.values(), out_ref.values(), out_naive.values(), spec.dtype, rtol, 0.0);
  // The LSE: the flash algorithm works in log2 units (scores folded with scale·log2e, LSE = (m + log2 l)·ln2),
  // which costs a few fp32 ulp of the LSE's magnitude that the natural-log baseline does not pay (on a small or
  // sink-dominated row the baseline's own error can be 0): allowed as 4 ulp of max|ref| over the finite rows.
  const std::vector<double> lse_r = lse_ref.values();
  double lse_scale = 0;
  for (double x : lse_r)
    if (std::isfinite(x)) lse_scale = std::max(lse_scale, std::fabs(x));
  r.lse = compare(lse.values(), lse_r, lse_naive.values(), DType::f32, rtol, 4 * 0x1p-23 * lse_scale);
  r.pass = r.out.pass && r.lse.pass;
  if (!r.out.pass) r.failure = "out: " + r.out.summary();
  else if (!r.lse.pass) r.failure = "lse: " + r.lse.summary();
  if (!spec.backward || (executor && !executor->has_backward())) return r;

  // Gradients w.r.t. a broadcast K/V are per kv head; give them real storage.
  auto dq = HostTensor::make(spec.dtype, qshape, spec.layout), dk = HostTensor::make(spec.dtype, kshape, spec.layout),
       dv = HostTensor::make(spec.dtype, kshape, spec.layout);
  for (auto* t : {&dq, &dk, &dv}) t->poison();
  if (executor) {
    if (!executor->backward(q, k, v, out, dout, lse, dq, dk, dv, spec.options)) return r;  // forward only
  } else {
    backward(q.desc(), k.desc(), v.desc(), out.desc(), dout.desc(), lse.desc(), dq.desc(), dk.desc(), dv.desc(),
             spec.options);
  }

  auto dq_ref = HostTensor::make(DType::f64, qshape), dk_ref = HostTensor::make(DType::f64, kshape),
       dv_ref = HostTensor::make(DType::f64, kshape);
  auto dq_naive = HostTensor::make(DType::f64, qshape), dk_naive = HostTensor::make(DType::f64, kshape),
       dv_naive = HostTensor::make(DType::f64, kshape);
  cpu::reference_backward(p, q.desc(), k.desc(), v.desc(), dout.desc(), dq_ref.desc(), dk_ref.desc(), dv_ref.desc(),
                          cpu::Precision::exact);
  cpu::reference_backward(p, q.desc(), k.desc(), v.desc(), dout.desc(), dq_naive.desc(), dk_naive.desc(),
                          dv_naive.desc(), cpu::Precision::storage);
  // Gradients: FlashAttention's 3e-4 with softcap. In f32 the naive baseline computes D = sum P dP from
  // the same products as dP, while the flash algorithm takes D = dO . O from the stored output, so the
  // cancellation in dP - D costs it a few ulps of the gradient's scale that the baseline does not pay:
  // allowed as 4 ulp of max|ref| (torch's f32 default, rtol 1.3e-6 + atol 1e-5, is looser).
  auto grad_atol = [&](const std::vector<double>& ref) {
    double scale = 0;
    for (double x : ref) scale = std::max(scale, std::fabs(x));
    return (spec.options.softcap > 0 ? 3e-4 : 0.0) + (spec.dtype == DType::f32 ? 4 * 0x1p-23 * scale : 0.0);
  };
  const auto dq_r = dq_ref.values(), dk_r = dk_ref.values(), dv_r = dv_ref.values();
  r.dq = compare(dq.values(), dq_r, dq_naive.values(), spec.dtype, rtol, grad_atol(dq_r));
  r.dk = compare(dk.values(), dk_r, dk_naive.values(), spec.dtype, rtol, grad_atol(dk_r));
  r.dv = compare(dv.values(), dv_r, dv_naive.values(), spec.dtype, rtol, grad_atol(dv_r));
  const std::pair<const char*, const Comparison*> grads[] = {{"dq", &r.dq}, {"dk", &r.dk}, {"dv", &r.dv}};
  for (const auto& [name, c] : grads) {
    if (!c->pass && r.failure.empty()) r.failure = std::string(name) + ": " + c->summary();
    r.pass = r.pass && c->pass;
  }
  return r;
}

}  // namespace fa4::testing
