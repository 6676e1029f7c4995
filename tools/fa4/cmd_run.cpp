// `fa4 run`: one attention (forward, backward or both) on random inputs on the best available backend;
// prints backend, shape, time and TFLOP/s, and checks sampled rows against the fp64 reference.
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <random>

#include "api/device_info.hpp"
#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "fa4/commands.hpp"
#include "fa4/common.hpp"
#include "fa4/gpu.hpp"

namespace fa4::cli {
namespace {

struct RunArgs {
  ProblemArgs problem;
  std::string pass = "auto";  // auto: forward, and backward where the backend has one
  std::string backend = "auto";
  int iters = 3;
  int check_rows = 8;
};

// Relative tolerance of a sampled row: max|ours - ref| <= tol * max(1, max|ref|). Two units in the last
// place of the output dtype, plus the fp32 accumulation error of a long row (loose enough never to flag
// a correct kernel, tight enough that any indexing or masking bug fails it).
double row_tolerance(DType dtype) {
  switch (dtype) {
    case DType::bf16: return 2.0 / 256;
    case DType::f16: return 2.0 / 2048;
    case DType::f32: return 2e-5;
    case DType::f64: return 1e-12;
  }
  return 0;
}

void run(const RunArgs& a) {
  const ProblemArgs& pa = a.problem;
  const DType dtype = parse_dtype(pa.dtype);
  const auto layout = parse_layout(pa.layout);
  const Options opts = pa.options();
  const std::array<int64_t, 4> qs{pa.batch, pa.sq(), pa.heads, pa.head_dim}, ks{pa.batch, pa.sk(), pa.hkv(), pa.head_dim};
  auto q = testing::HostTensor::make(dtype, qs, layout), k = testing::HostTensor::make(dtype, ks, layout),
       v = testing::HostTensor::make(dtype, ks, layout), out = testing::HostTensor::make(dtype, qs, layout);
  auto lse = testing::HostTensor::make_lse({pa.batch, pa.heads, pa.sq()});
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
  std::unique_ptr<gpu::Mirror> dq_, dk_, dv_, dout_, dlse_;
  bool gpu_bwd = false;
  if (a.backend != "cpu" && why.empty()) {
    dq_ = std::make_unique<gpu::Mirror>(q), dk_ = std::make_unique<gpu::Mirror>(k), dv_ = std::make_unique<gpu::Mirror>(v);
    const Support fwd = supports(Pass::forward, dq_->desc(), dk_->desc(), dv_->desc(), opts);
    const Support bwd = supports(Pass::backward, dq_->desc(), dk_->desc(), dv_->desc(), opts);
    gpu_bwd = bwd.ok;
    if (!fwd.ok)
      why = fwd.reason;
    else if (require_bwd && !bwd.ok)
      why = bwd.reason;
    else
      device = Device::cuda, why = detail::cuda_devices()[0].name;
  }
  if (a.backend == "cuda" && device != Device::cuda) throw Error(Status::unsupported, "fa4 run: --backend cuda: " + why);
  if (device == Device::cuda) dout_ = std::make_unique<gpu::Mirror>(out), dlse_ = std::make_unique<gpu::Mirror>(lse);
  fmt::print("backend   {} ({})\n", to_string(device), why);
  fmt::print("problem   {}\n", pa.shape_string());
  const bool do_fwd = true, do_bwd = a.pass != "fwd" && (device == Device::cpu || gpu_bwd);
  if (device == Device::cuda && a.pass == "auto" && !gpu_bwd) fmt::print("backward  not run: no CUDA backward kernel yet\n");
  if (do_fwd) {
    const double sec =
        device == Device::cuda
            ? gpu::median_ms([&] { forward(dq_->desc(), dk_->desc(), dv_->desc(), dout_->desc(), &dlse_->desc(), opts); },
                             a.iters) * 1e-3
            : median_seconds([&] { forward(q.desc(), k.desc(), v.desc(), out.desc(), &lse.desc(), opts); }, a.iters);
    if (device == Device::cuda) dout_->copy_to(out), dlse_->copy_to(lse);
    const double fl = attention_flops(pa.batch, pa.heads, pa.sq(), pa.sk(), pa.head_dim, opts, Pass::forward);
    if (a.pass != "bwd") fmt::print("forward   {:10.3f} ms   {:8.3f} TFLOP/s   (median of {})\n", sec * 1e3, fl / sec / 1e12, a.iters);
  }
  testing::HostTensor dout, dq, dk, dv;
  if (do_bwd) {
    dout = testing::HostTensor::make(dtype, qs, layout);
    dout.fill_normal(pa.seed * 7 + 4);
    dq = testing::HostTensor::make(dtype, qs, layout), dk = testing::HostTensor::make(dtype, ks, layout),
    dv = testing::HostTensor::make(dtype, ks, layout);
    for (auto* t : {&dq, &dk, &dv}) t->poison();
    const double sec = median_seconds([&] {
      backward(q.desc(), k.desc(), v.desc(), out.desc(), dout.desc(), lse.desc(), dq.desc(), dk.desc(), dv.desc(), opts);
    }, a.iters);
    const double fl = attention_flops(pa.batch, pa.heads, pa.sq(), pa.sk(), pa.head_dim, opts, Pass::backward);
    fmt::print("backward  {:10.3f} ms   {:8.3f} TFLOP/s   (median of {})\n", sec * 1e3, fl / sec / 1e12, a.iters);
  }

  // Spot check: sampled rows of O (and dQ) against the fp64 reference.
  if (a.check_rows <= 0 || pa.batch * pa.heads * pa.sq() == 0) {
    fmt::print("check     skipped\n");
    return;
  }
  std::mt19937_64 rng(pa.seed);
  const double tol = row_tolerance(dtype);
  double worst_o = 0, worst_dq = 0;
  bool finite = true;
  std::vector<double> ref(pa.head_dim);
  for (int r = 0; r < a.check_rows; ++r) {
    const int64_t b = rng() % pa.batch, h = rng() % pa.heads, i = r == 0 ? pa.sq() - 1 : rng() % pa.sq();
    auto row_error = [&](const testing::HostTensor& t) {
      double scale = 1, err = 0;
      for (int64_t c = 0; c < pa.head_dim; ++c) scale = std::max(scale, std::fabs(ref[c]));
      for (int64_t c = 0; c < pa.head_dim; ++c) {
        const double x = t.at({b, i, h, c});
        finite = finite && std::isfinite(x);
        err = std::max(err, std::fabs(x - ref[c]));
      }
      return err / scale;
    };
    cpu::reference_forward_row(prob, q.desc(), k.desc(), v.desc(), b, h, i, ref.data());
    worst_o = std::max(worst_o, row_error(out));
    if (do_bwd) {
      cpu::reference_backward_dq_row(prob, q.desc(), k.desc(), v.desc(), dout.desc(), b, h, i, ref.data());
      worst_dq = std::max(worst_dq, row_error(dq));
    }
  }
  const bool ok = finite && worst_o <= tol && worst_dq <= tol;
  fmt::print("check     {}: {} sampled rows of O{} vs the fp64 reference: max rel err {:.2e}{} (tolerance {:.1e}){}\n",
             ok ? "PASS" : "FAIL", a.check_rows, do_bwd ? " and dQ" : "", worst_o,
             do_bwd ? fmt::format(" / {:.2e}", worst_dq) : "", tol, finite ? "" : ", non-finite values");
  if (!ok) set_exit_code(1);
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
  cmd->add_option("--iters", args->iters, "timed iterations (median reported)")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--check-rows", args->check_rows, "rows checked against the reference (0: none)")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace fa4::cli
