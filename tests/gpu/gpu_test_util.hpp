// What the sm_90a GPU tests share: the device check, CUDA error assertions and device copies of host tensors.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/device_info.hpp"
#include "fa4/fa4.hpp"
#include "testing/env.hpp"
#include "testing/tensors.hpp"
#include "testing/tolerance.hpp"

namespace {

using fa4::testing::HostTensor;

inline bool have_sm90() {
  const auto gpus = fa4::detail::cuda_devices();
  return !gpus.empty() && gpus[0].cc_major == 9 && gpus[0].cc_minor == 0;
}

#define REQUIRE_SM90()                                                                   \
  do {                                                                                   \
    if (!have_sm90()) GTEST_SKIP() << "the sm_90a kernels need a compute capability 9.0 GPU"; \
  } while (0)

#define CUDA_OK(expr)                                                                                 \
  do {                                                                                                \
    const cudaError_t e_ = (expr);                                                                    \
    ASSERT_EQ(e_, cudaSuccess) << #expr << " -> " << cudaGetErrorName(e_) << ": " << cudaGetErrorString(e_); \
  } while (0)

// The compiled sm90 kernels of one pass, as (dtype, head dim) pairs: the rows of src/cuda/instances.def.
inline std::vector<std::pair<fa4::DType, int>> compiled_instances(bool backward) {
  std::vector<std::pair<fa4::DType, int>> rows;
#define FA4_IF_sm90(...) __VA_ARGS__
#define FA4_IF_sm100(...)
#define FA4_IF_fwd(...) \
  if (!backward) {      \
    __VA_ARGS__         \
  }
#define FA4_IF_bwd(...) \
  if (backward) {       \
    __VA_ARGS__         \
  }
#define FA4_KERNEL(arch, pass, dtype, head_dim) FA4_IF_##arch(FA4_IF_##pass(rows.push_back({fa4::DType::dtype, head_dim});))
#include "cuda/instances.def"
#undef FA4_IF_sm90
#undef FA4_IF_sm100
#undef FA4_IF_fwd
#undef FA4_IF_bwd
  return rows;
}

// The dtype's unit roundoff (round to nearest) of a stored output element.
inline double roundoff(fa4::DType dtype) { return dtype == fa4::DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

// int32 metadata (cu_seqlens, page tables, ...) on the device, as an engine passes them.
struct DeviceInts {
  int32_t* ptr = nullptr;
  explicit DeviceInts(const std::vector<int32_t>& v) {
    cudaMalloc(&ptr, std::max<size_t>(v.size(), 1) * sizeof(int32_t));
    cudaMemcpy(ptr, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
  }
  ~DeviceInts() { cudaFree(ptr); }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
};

// A device copy of a host tensor: same logical shape and strides, the same dense byte image.
class DeviceCopy {
 public:
  DeviceCopy(const HostTensor& h, size_t storage_elems) : bytes_(storage_elems * fa4::element_size(h.desc().dtype)) {
    if (cudaMalloc(&ptr_, std::max<size_t>(bytes_, 16)) != cudaSuccess) ptr_ = nullptr;
    if (ptr_ && bytes_) cudaMemcpy(ptr_, h.desc().data, bytes_, cudaMemcpyHostToDevice);
    desc_ = h.desc();
    desc_.data = ptr_;
    desc_.device = fa4::Device::cuda;
    desc_.device_index = 0;
  }
  ~DeviceCopy() { cudaFree(ptr_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  const fa4::Tensor& desc() const { return desc_; }
  bool ok() const { return ptr_ != nullptr; }
  void copy_back(HostTensor& h) const {
    if (bytes_) cudaMemcpy(h.desc().data, ptr_, bytes_, cudaMemcpyDeviceToHost);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  fa4::Tensor desc_;
};

// One GPU test case: sizes, dtype, options, layout, seed (fresh random inputs per seed).
struct GpuCase {
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_kv = 1, head_dim = 64;
  fa4::DType dtype = fa4::DType::bf16;
  fa4::Options options;
  fa4::testing::Layout layout = fa4::testing::Layout::bshd;
  bool broadcast_kv = false;  // K/V heads as stride-0 views of one stored head
  uint64_t seed = 1;
  fa4::testing::CaseSpec spec() const {
    fa4::testing::CaseSpec s;
    s.batch = batch, s.seqlen_q = seqlen_q, s.seqlen_k = seqlen_k, s.heads_q = heads_q, s.heads_kv = heads_kv;
    s.head_dim = head_dim, s.dtype = dtype, s.options = options, s.layout = layout, s.broadcast_kv = broadcast_kv;
    s.seed = seed;
    return s;
  }
};

struct Shape {
  int64_t seqlen_q, seqlen_k;
};

enum class MaskKind { none, causal, window };
inline fa4::Options options_for(MaskKind m) {
  fa4::Options o;
  if (m == MaskKind::causal) o.causal = true;
  if (m == MaskKind::window) o.window_left = 37, o.window_right = 11;
  return o;
}

// DESIGN.md §4's sweep for one compiled kernel: every shape × {no mask, causal, window}; MHA / GQA (group 3) /
// MQA and softcap rotate over the cases so that each meets every shape class. Calls check(case, n) with the
// case's running index n; `seed` numbers the cases across calls.
template <class Case, size_t N, class Check>
void for_each_sweep_case(fa4::DType dtype, int head_dim, const Shape (&shapes)[N], uint64_t& seed, Check&& check) {
  struct Heads {
    int64_t q, kv;
  };
  const Heads heads[] = {{2, 2}, {6, 2}, {3, 1}};
  int n = 0;
  for (const Shape& s : shapes)
    for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::window}) {
      Case c;
      c.dtype = dtype;
      c.head_dim = head_dim;
      c.seqlen_q = s.seqlen_q;
      c.seqlen_k = s.seqlen_k;
      c.batch = s.seqlen_q * s.seqlen_k > 100000 ? 1 : 2;
      c.heads_q = heads[n % 3].q;
      c.heads_kv = heads[n % 3].kv;
      c.options = options_for(m);
      if (n % 4 == 3) c.options.softcap = 30.0f;
      c.seed = seed++;
      check(c, n);
      ++n;
    }
}

using fa4::testing::EnvOverride;  // testing/env.hpp

// Kernel nodes of what call(stream) enqueues on a fresh stream under CUDA-graph capture (nothing runs), into
// *kernels: how many launches a library call makes. `call` reports its own errors (a throw would leave the capture
// open).
template <class Call>
void captured_kernels(Call&& call, size_t* kernels) {
  *kernels = 0;
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  call(reinterpret_cast<fa4::Stream>(stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  size_t count = 0;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CUDA_OK(cudaGraphGetNodes(graph, nodes.data(), &count));
  for (cudaGraphNode_t n : nodes) {
    cudaGraphNodeType type{};
    CUDA_OK(cudaGraphNodeGetType(n, &type));
    *kernels += type == cudaGraphNodeTypeKernel;
  }
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
