// The CLI's GPU side: device mirrors of host tensors, CUDA-event timing, and an executor that runs a
// self-checking case's forward on the GPU. Everything here reports "unavailable" in a build without CUDA.
#pragma once

#include <functional>
#include <string>

#include "fa4/fa4.hpp"
#include "testing/tolerance.hpp"

namespace fa4::cli::gpu {

// Why the GPU cannot be used ("" when it can): built without CUDA, or no device visible.
std::string unavailable_reason();

// Device memory holding a byte-for-byte copy of a host tensor (same strides); freed on destruction.
class Mirror {
 public:
  explicit Mirror(const testing::HostTensor& host);
  ~Mirror();
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;
  const Tensor& desc() const { return desc_; }
  void copy_to(testing::HostTensor& host) const;  // device -> host, same layout

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  Tensor desc_;
};

// Median milliseconds of `fn` over `iters` runs on the default stream, timed with CUDA events after one
// warm-up run.
double median_ms(const std::function<void()>& fn, int iters);

// Runs the forward of testing::run_case on the GPU (the backward is not available there yet).
class Executor : public testing::Executor {
 public:
  const char* name() const override { return "cuda"; }
  bool has_backward() const override { return false; }
  void forward(testing::HostTensor& q, testing::HostTensor& k, testing::HostTensor& v, testing::HostTensor& out,
               testing::HostTensor& lse, const Options& options) override;
};

}  // namespace fa4::cli::gpu
