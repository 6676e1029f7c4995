// Built instead of src/cuda/device_info.cu when fa4 is configured without CUDA.
#include "api/device_info.hpp"

namespace fa4::detail {

bool built_with_cuda() { return false; }
std::string cuda_archs() { return ""; }
std::vector<GpuInfo> cuda_devices() { return {}; }

}  // namespace fa4::detail
