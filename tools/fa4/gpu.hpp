// The CLI's GPU side: device mirrors of host tensors, device buffers, CUDA-event timing, and an executor that
// runs a self-checking case's forward and backward on the GPU. Everything here reports "unavailable" in a
// build without CUDA.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "fa4/fa4.hpp"
#include "testing/tolerance.hpp"

namespace fa4::cli::gpu {

// Why the GPU cannot be used ("" when it can): built without CUDA, or no device visible.
std::string unavailable_reason();

// L2 cache size of the current device in bytes (0 when unknown).
std::size_t l2_bytes();

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

// Device memory of `bytes` bytes, every byte set to `fill` (0xff: NaN in bf16, fp16 and fp32, and -1 in any
// integer: a workspace the library must not assume zeroed); freed on destruction. bytes == 0: no memory.
class Buffer {
 public:
  explicit Buffer(std::size_t bytes, int fill = 0xff);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Workspace workspace() const { return {ptr_, bytes_}; }
  void* data() const { return ptr_; }
  void upload(const void* host, std::size_t bytes);  // host -> the first `bytes` bytes (at most its size)

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Median milliseconds of `fn` over `iters` runs on the default stream, timed with CUDA events after one
// warm-up run.
double median_ms(const std::function<void()>& fn, int iters);

// Host microseconds per call of `fn` (an asynchronous launch sequence): after a warm-up call and a
// synchronization, `calls` back-to-back calls timed by the host clock with nothing synchronized in between,
// then one synchronization (not timed). What an engine's CPU thread pays per attention call.
double host_us_per_call(const std::function<void()>& fn, int calls);

// The same over calls that each use their own inputs (a rotation whose working sets together exceed L2, so
// that no call finds its inputs in L2): one warm-up round of every call, then at least `iters` calls in whole
// rounds, each timed alone with CUDA events; the median.
double median_ms(const std::vector<std::function<void()>>& calls, int iters);

// Runs testing::run_case's passes on the GPU: mirrors the host tensors to device memory, runs there, copies the
// outputs back.
class Executor : public testing::Executor {
 public:
  const char* name() const override { return "cuda"; }
  bool has_backward() const override { return true; }
  void forward(testing::HostTensor& q, testing::HostTensor& k, testing::HostTensor& v, testing::HostTensor& out,
               testing::HostTensor& lse, const Options& options) override;
  // The backward on the device with a NaN-poisoned workspace (dq, dk, dv arrive NaN-poisoned too). Returns
  // false, running nothing, where fa4::supports refuses this problem's backward on the GPU; backward_skipped()
  // then says why (reset by each forward()).
  bool backward(const testing::HostTensor& q, const testing::HostTensor& k, const testing::HostTensor& v,
                const testing::HostTensor& out, const testing::HostTensor& dout, const testing::HostTensor& lse,
                testing::HostTensor& dq, testing::HostTensor& dk, testing::HostTensor& dv, const Options& options) override;
  const std::string& backward_skipped() const { return backward_skipped_; }

 private:
  std::string backward_skipped_;
};

}  // namespace fa4::cli::gpu
