// The launchers' side of the trace session (session.hpp), C++17 so the CUDA sources can include it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trace/format.hpp"

namespace fa4::trace {

// The sink of this launch when the session is armed (device memory allocated, counts zeroed on `stream`), else
// an empty sink (the kernels then record nothing).
Sink begin_launch(const std::string& kernel, uint32_t ctas, std::vector<std::string> writer_names,
                  cudaStream_t stream);

}  // namespace fa4::trace
