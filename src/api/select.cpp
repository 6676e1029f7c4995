#include "api/select.hpp"

#include <string>

#if defined(FA4_WITH_SM90)
#include "cuda/sm90/launch.hpp"
#endif

namespace fa4::detail {
namespace {

[[noreturn]] void unsupported(const char* call, const std::string& expected, const std::string& got) {
  throw Error(Status::unsupported, std::string(call) + ": argument 'q': expected " + expected + ", got " + got);
}

#if defined(FA4_WITH_SM90)
// "bf16 d64, bf16 d128, ...": the compiled rows, for messages.
// "sm90 fwd bf16 d64/128/256, sm90 fwd f16 d64/128/256": head dims of consecutive rows that share
// (arch, pass, dtype) join one entry, so the message stays short as rows are added.
std::string compiled_kernels() {
  std::string list, prefix;
  auto add = [&](const std::string& row_prefix, const char* head_dim) {
    if (row_prefix == prefix) {
      list += std::string("/") + head_dim;
      return;
    }
    list += (list.empty() ? "" : ", ") + row_prefix + " d" + head_dim;
    prefix = row_prefix;
  };
#define FA4_KERNEL(arch, pass, dtype, head_dim) add(#arch " " #pass " " #dtype, #head_dim);
#include "cuda/instances.def"
  return list;
}
#endif

}  // namespace

Backend require_backend(const char* call, const Problem& p) {
  if (p.device == Device::cpu) return Backend::cpu;  // the CPU backend runs every validated problem
#if defined(FA4_WITH_SM90)
  const std::string got = std::string("cuda tensors of dtype ") + to_string(p.dtype) + " with head_dim " +
                          std::to_string(p.head_dim);
  if (!sm90::has_forward_kernel(p.dtype, p.head_dim))
    unsupported(call, "a (dtype, head_dim) with a compiled CUDA kernel (" + compiled_kernels() + "; or cpu tensors)",
                got);
  if (!sm90::device_is_sm90(p.device_index))
    unsupported(call, "cuda tensors on a compute capability 9.0 (Hopper) GPU, the only one this build has kernels for",
                "cuda device " + std::to_string(p.device_index));
  return Backend::cuda;
#elif defined(FA4_WITH_CUDA)
  unsupported(call, "cpu tensors (this build of fa4 has no sm_90a kernels: FA4_CUDA_ARCHS lacks 90a)",
              "cuda tensors");
#else
  unsupported(call, "cpu tensors (this build of fa4 has no CUDA backend; configure with -DFA4_CUDA=ON)",
              "cuda tensors");
#endif
}

void require_pass(const char* call, const Problem& p, Pass pass) {
  if (p.device != Device::cuda || pass != Pass::backward) return;
#if defined(FA4_WITH_SM90)
  if (!sm90::has_backward_kernel(p.dtype, p.head_dim))
    unsupported(call, "a (dtype, head_dim) with a compiled CUDA backward kernel (" + compiled_kernels() + ")",
                std::string("cuda tensors of dtype ") + to_string(p.dtype) + " with head_dim " + std::to_string(p.head_dim));
  sm90::check_backward_overrides(call, p, /*varlen=*/false);
#else
  (void)call;
#endif
}

void require_layout(const char* call, const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                    const char* k_name, const char* v_name) {
  if (p.device != Device::cuda) return;
#if defined(FA4_WITH_SM90)
  sm90::check_tma_layout(call, "q", q);
  sm90::check_tma_layout(call, k_name, k);
  sm90::check_tma_layout(call, v_name, v);
#else
  (void)call, (void)q, (void)k, (void)v, (void)k_name, (void)v_name;
#endif
}

void require_backward_layout(const char* call, const Problem& p, const Tensor& dout) {
  if (p.device != Device::cuda) return;
#if defined(FA4_WITH_SM90)
  sm90::check_tma_layout(call, "dout", dout);
#else
  (void)call, (void)dout;
#endif
}

std::size_t workspace_bytes(const Problem& p, Pass pass) {
  // The CPU backend keeps its scratch per thread, internally; the sm_90a forward needs one only for split-KV.
#if defined(FA4_WITH_SM90)
  if (p.device == Device::cuda && pass == Pass::backward) return sm90::backward_workspace_bytes(p);
  if (p.device == Device::cuda && pass == Pass::forward) return sm90::forward_workspace_bytes(p);
#else
  (void)p, (void)pass;
#endif
  return 0;
}

}  // namespace fa4::detail
