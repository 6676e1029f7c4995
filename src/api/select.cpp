#include "api/select.hpp"

#include <string>

namespace fa4::detail {

Backend require_backend(const char* call, const Problem& p) {
  if (p.device == Device::cpu) return Backend::cpu;  // the CPU backend runs every validated problem
#if defined(FA4_WITH_CUDA)
  // src/cuda/instances.def lists the compiled GPU kernels; it is empty until the sm_90a forward lands.
  throw Error(Status::unsupported, std::string(call) + ": argument 'q': expected cpu tensors (this build of fa4 has "
                                                      "no CUDA attention kernels yet), got cuda tensors");
#else
  throw Error(Status::unsupported, std::string(call) + ": argument 'q': expected cpu tensors (this build of fa4 has "
                                                      "no CUDA backend; configure with -DFA4_CUDA=ON), got cuda tensors");
#endif
}

std::size_t workspace_bytes(const Problem&, Pass) {
  return 0;  // the CPU backend keeps its scratch per thread, internally; GPU kernels will report theirs here
}

}  // namespace fa4::detail
