#include "fa4/gpu.hpp"

#include <algorithm>
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

void Executor::forward(testing::HostTensor& q, testing::HostTensor& k, testing::HostTensor& v,
                       testing::HostTensor& out, testing::HostTensor& lse, const Options& options) {
  const Mirror dq(q), dk(k), dv(v), dout(out), dlse(lse);  // out and lse arrive NaN-poisoned
  fa4::forward(dq.desc(), dk.desc(), dv.desc(), dout.desc(), &dlse.desc(), options);
  check(cudaDeviceSynchronize(), "forward");
  dout.copy_to(out);
  dlse.copy_to(lse);
}

#else  // built without CUDA

std::string unavailable_reason() { return "built without CUDA"; }
Mirror::Mirror(const testing::HostTensor&) { throw Error(Status::unsupported, "fa4: built without CUDA"); }
Mirror::~Mirror() = default;
void Mirror::copy_to(testing::HostTensor&) const {}
double median_ms(const std::function<void()>&, int) { throw Error(Status::unsupported, "fa4: built without CUDA"); }
void Executor::forward(testing::HostTensor&, testing::HostTensor&, testing::HostTensor&, testing::HostTensor&,
                       testing::HostTensor&, const Options&) {
  throw Error(Status::unsupported, "fa4: built without CUDA");
}

#endif

}  // namespace fa4::cli::gpu
