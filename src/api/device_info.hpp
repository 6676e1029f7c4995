// What the CUDA runtime sees (empty without a CUDA build or without a GPU). Used by `fa4 info`, `fa4 run`
// and the GPU tests' skip logic.
#pragma once

#include <string>
#include <vector>

namespace fa4::detail {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  double memory_gib = 0;
};

bool built_with_cuda();
std::string cuda_archs();  // e.g. "90a;100a", empty without CUDA
std::vector<GpuInfo> cuda_devices();  // never throws; empty when the runtime finds none

}  // namespace fa4::detail
