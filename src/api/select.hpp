// Kernel selection: the one function that decides which backend (and, on the GPU, which compiled kernel)
// runs a validated problem, and how much workspace it needs.
#pragma once

#include <cstddef>

#include "api/problem.hpp"

namespace fa4::detail {

enum class Backend { cpu, cuda };

// Throws Error(unsupported) naming the reason when no backend of this build can run the problem.
Backend require_backend(const char* call, const Problem& p);

std::size_t workspace_bytes(const Problem& p, Pass pass);

}  // namespace fa4::detail
