// The C++ entry points: validate, select, dispatch.
#include "api/select.hpp"
#include "api/validate.hpp"
#include "cpu/backend.hpp"
#include "fa4/fa4.hpp"

#if defined(FA4_WITH_SM90)
#include "cuda/sm90/launch.hpp"
#endif

namespace fa4 {

void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
             const Options& options, Workspace workspace, Stream stream) {
  const detail::Problem p = detail::validate_forward(q, k, v, out, lse, options, workspace, stream);
  switch (detail::require_backend("fa4::forward", p)) {
    case detail::Backend::cpu: cpu::forward(p, q, k, v, out, lse); return;
    case detail::Backend::cuda:
#if defined(FA4_WITH_SM90)
      sm90::forward(p, q, k, v, out, lse, workspace, stream);
      return;
#else
      break;
#endif
  }
  throw Error(Status::internal, "fa4::forward: selected backend has no forward");
}

void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
              const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& options,
              Workspace workspace, Stream stream) {
  const detail::Problem p =
      detail::validate_backward(q, k, v, out, dout, lse, dq, dk, dv, options, workspace, stream);
  switch (detail::require_backend("fa4::backward", p)) {
    case detail::Backend::cpu: cpu::backward(p, q, k, v, out, dout, lse, dq, dk, dv); return;
    case detail::Backend::cuda:
#if defined(FA4_WITH_SM90)
      sm90::backward(p, q, k, v, out, dout, lse, dq, dk, dv, workspace, stream);
      return;
#else
      break;
#endif
  }
  throw Error(Status::internal, "fa4::backward: selected backend has no backward");
}

std::size_t workspace_size(Pass pass, const Tensor& q, const Tensor& k, const Tensor& v, const Options& options) {
  return detail::workspace_bytes(detail::validate_inputs("fa4::workspace_size", q, k, v, options), pass);
}

Support supports(Pass pass, const Tensor& q, const Tensor& k, const Tensor& v, const Options& options) {
  try {
    if (pass != Pass::forward && pass != Pass::backward)
      throw Error(Status::invalid_argument, "fa4::supports: argument 'pass': expected forward or backward, got code " +
                                                std::to_string(static_cast<int>(pass)));
    const detail::Problem p = detail::validate_inputs("fa4::supports", q, k, v, options);
    detail::check_sink_options("fa4::supports", options, p.heads_q, q, pass == Pass::forward);
    detail::require_pass("fa4::supports", p, pass);
    if (pass == Pass::backward) detail::check_backward_splits("fa4::supports", options);
    return {true, Status::ok, ""};
  } catch (const Error& e) {
    return {false, e.code(), e.what()};
  }
}

}  // namespace fa4
