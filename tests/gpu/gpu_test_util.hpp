// What the sm_90a GPU tests share: the device check, CUDA error assertions and device copies of host tensors.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>

#include "api/device_info.hpp"
#include "fa4/fa4.hpp"
#include "testing/tensors.hpp"

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

}  // namespace
