#include <cuda_runtime.h>

#include "api/device_info.hpp"

namespace fa4::detail {

bool built_with_cuda() { return true; }
std::string cuda_archs() { return FA4_CUDA_ARCHS; }

std::vector<GpuInfo> cuda_devices() {
  std::vector<GpuInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    out.push_back({i, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                   static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0)});
  }
  return out;
}

}  // namespace fa4::detail
