#include "fa4/gpu.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "api/device_info.hpp"

#if defined(FA4_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace fa4::cli::gpu {

#if defined(FA4_WITH_CUDA)
namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(Status::cuda_error, std::string("fa4: ") + what + ": " + cudaGetErrorString(e));
}
}  // namespace

std::string unavailable_reason() { return detail::cuda_devices().empty() ? "no GPU found" : ""; }

std::size_t l2_bytes() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess)
    return 0;
  return static_cast<std::size_t>(bytes);
}

Mirror::Mirror(const testing::HostTensor& host) : bytes_(host.storage().size()), desc_(host.desc()) {
  check(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
  check(cudaMemcpy(ptr_, host.storage().data(), bytes_, cudaMemcpyHostToDevice), "copy to device");
  desc_.data = ptr_;
  desc_.device = Device::cuda;
}

Mirror::~Mirror() { cudaFree(ptr_); }

void Mirror::copy_to(testing::HostTensor& host) const {
  check(cudaMemcpy(host.storage().data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "copy to host");
}

Buffer::Buffer(std::size_t bytes, int fill) : bytes_(bytes) {
  if (bytes_ == 0) return;
  check(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
  check(cudaMemset(ptr_, fill, bytes_), "cudaMemset");
}

Buffer::~Buffer() { cudaFree(ptr_); }

void Buffer::upload(const void* host, std::size_t bytes) {
  if (bytes > bytes_) throw Error(Status::internal, "gpu::Buffer::upload: more bytes than the buffer holds");
  if (bytes > 0) check(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "copy to device");
}

double median_ms(const std::vector<std::function<void()>>& calls, int iters) {
  const int n = static_cast<int>(calls.size());
  if (n == 0) return 0;
  for (const auto& fn : calls) fn();  // warm-up: module load, first touch, one round of the rotation
  check(cudaDeviceSynchronize(), "warm-up");
  const int reps = (std::max(iters, n) + n - 1) / n * n;  // whole rounds
  std::vector<cudaEvent_t> start(reps), stop(reps);
  for (int i = 0; i < reps; ++i) {
    check(cudaEventCreate(&start[i]), "cudaEventCreate");
    check(cudaEventCreate(&stop[i]), "cudaEventCreate");
  }
  for (int i = 0; i < reps; ++i) {  // queued back to back: the host stays ahead, launch gaps stay off the clock
    check(cudaEventRecord(start[i]), "cudaEventRecord");
    calls[i % n]();
    check(cudaEventRecord(stop[i]), "cudaEventRecord");
  }
  check(cudaDeviceSynchronize(), "kernel");
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    check(cudaEventElapsedTime(&ms[i], start[i], stop[i]), "cudaEventElapsedTime");
    cudaEventDestroy(start[i]);
    cudaEventDestroy(stop[i]);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double median_ms(const std::function<void()>& fn, int iters) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  fn();  // warm-up: module load, first-touch
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "kernel");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double host_us_per_call(const std::function<void()>& fn, int calls) {
  fn();
  check(cudaDeviceSynchronize(), "warm-up");
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) fn();
  const auto stop = std::chrono::steady_clock::now();
  check(cudaDeviceSynchronize(), "the timed calls");
  return std::chrono::duration<double, std::micro>(stop - start).count() / calls;
}

void Executor::forward(testing::HostTensor& q, testing::HostTensor& k, testing::HostTensor& v,
                       testing::HostTensor& out, testing::HostTensor& lse, const Options& options) {
  backward_skipped_.clear();
  const Mirror dq(q), dk(k), dv(v), dout(out), dlse(lse);  // out and lse arrive NaN-poisoned
  fa4::forward(dq.desc(), dk.desc(), dv.desc(), dout.desc(), &dlse.desc(), options);
  check(cudaDeviceSynchronize(), "forward");
  dout.copy_to(out);
  dlse.copy_to(lse);
}

bool Executor::backward(const testing::HostTensor& q, const testing::HostTensor& k, const testing::HostTensor& v,
                        const testing::HostTensor& out, const testing::HostTensor& dout, const testing::HostTensor& lse,
                        testing::HostTensor& dq, testing::HostTensor& dk, testing::HostTensor& dv,
                        const Options& options) {
  backward_skipped_.clear();
  const Mirror mq(q), mk(k), mv(v), mout(out), mdout(dout), mlse(lse), mdq(dq), mdk(dk), mdv(dv);
  const Support s = supports(Pass::backward, mq.desc(), mk.desc(), mv.desc(), options);
  if (!s.ok) {
    backward_skipped_ = s.reason;
    return false;
  }
  const Buffer ws(workspace_size(Pass::backward, mq.desc(), mk.desc(), mv.desc(), options));  // NaN-poisoned
  fa4::backward(mq.desc(), mk.desc(), mv.desc(), mout.desc(), mdout.desc(), mlse.desc(), mdq.desc(), mdk.desc(),
                mdv.desc(), options, ws.workspace());
  check(cudaDeviceSynchronize(), "backward");
  mdq.copy_to(dq);
  mdk.copy_to(dk);
  mdv.copy_to(dv);
  return true;
}

#else  // built without CUDA

namespace {
[[noreturn]] void no_cuda() { throw Error(Status::unsupported, "fa4: built without CUDA"); }
}  // namespace

std::string unavailable_reason() { return "built without CUDA"; }
std::size_t l2_bytes() { return 0; }
Mirror::Mirror(const testing::HostTensor&) { no_cuda(); }
Mirror::~Mirror() = default;
void Mirror::copy_to(testing::HostTensor&) const {}
Buffer::Buffer(std::size_t, int) { no_cuda(); }
Buffer::~Buffer() = default;
void Buffer::upload(const void*, std::size_t) { no_cuda(); }
double median_ms(const std::function<void()>&, int) { no_cuda(); }
double host_us_per_call(const std::function<void()>&, int) { no_cuda(); }
double median_ms(const std::vector<std::function<void()>>&, int) { no_cuda(); }
void Executor::forward(testing::HostTensor&, testing::HostTensor&, testing::HostTensor&, testing::HostTensor&,
                       testing::HostTensor&, const Options&) {
  no_cuda();
}
bool Executor::backward(const testing::HostTensor&, const testing::HostTensor&, const testing::HostTensor&,
                        const testing::HostTensor&, const testing::HostTensor&, const testing::HostTensor&,
                        testing::HostTensor&, testing::HostTensor&, testing::HostTensor&, const Options&) {
  no_cuda();
}

#endif

}  // namespace fa4::cli::gpu
