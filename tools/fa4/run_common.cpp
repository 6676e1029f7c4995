// fa4 run's shared helpers (run_common.hpp).
#include "fa4/run_common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fa4/commands.hpp"

namespace fa4::cli {

double row_tolerance(DType dtype) {
  switch (dtype) {
    case DType::bf16: return 2.0 / 256;
    case DType::f16: return 2.0 / 2048;
    case DType::f32: return 2e-5;
    case DType::f64: return 1e-12;
  }
  return 0;
}

double row_error(const testing::HostTensor& out, int64_t b, int64_t i, int64_t h, const std::vector<double>& ref,
                 bool& finite) {
  double scale = 1, err = 0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  for (size_t c = 0; c < ref.size(); ++c) {
    const double x = out.at({b, i, h, int64_t(c)});
    finite = finite && std::isfinite(x);
    err = std::max(err, std::fabs(x - ref[c]));
  }
  return err / scale;
}

void print_timing(const char* pass, double seconds, double flops, int iters) {
  fmt::print("{:<9} {:10.3f} ms   {:8.3f} TFLOP/s   (median of {})\n", pass, seconds * 1e3, flops / seconds / 1e12,
             iters);
}

void print_check(bool ok, const std::string& what, double tol, bool finite) {
  fmt::print("check     {}: max rel err vs the fp64 reference {} (tolerance {:.1e}){}\n", ok ? "PASS" : "FAIL", what, tol,
             finite ? "" : "; non-finite values");
  if (!ok) set_exit_code(1);
}

// The packed [total, heads, d] (rank 3) view of a [1, total, heads, d] tensor (host, or its device mirror).
Tensor packed_view(const Tensor& t) {
  Tensor p = t;
  p.rank = 3;
  p.shape = {t.shape[1], t.shape[2], t.shape[3], 1};
  p.stride = {t.stride[1], t.stride[2], t.stride[3], 1};
  return p;
}
Tensor packed_view(const testing::HostTensor& t) { return packed_view(t.desc()); }

// The [heads, total] varlen lse of a [1, heads, total] lse tensor.
Tensor varlen_lse_view(const Tensor& t) {
  Tensor l = t;
  l.rank = 2;
  l.shape = {t.shape[1], t.shape[2], 1, 1};
  l.stride = {t.stride[1], t.stride[2], 0, 0};
  return l;
}

}  // namespace fa4::cli
