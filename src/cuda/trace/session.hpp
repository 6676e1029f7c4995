// Recording traces from the library's launches (trace builds, -DFA4_TRACE=ON): the CLI arms the session, runs
// one call, and takes the trace of the last kernel launched while armed; the launchers ask for a sink
// (launch_sink.hpp, which the C++17 CUDA sources can include). In an untraced build compiled_in() is false and
// arm() refuses; nothing else changes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuda/trace/launch_sink.hpp"
#include "trace/trace.hpp"

namespace fa4::trace {

// Whether the kernels of this build record (configured with -DFA4_TRACE=ON).
bool compiled_in();

// Every sm_90a main-kernel launch from now until disarm() records into a fresh device buffer of `capacity`
// events per writer; take_last() returns the last of them. Throws std::runtime_error in an untraced build.
void arm(uint32_t capacity);
void disarm();

// The trace of the last launch recorded since arm(), copied to the host (synchronises the device); frees its
// buffer. nullopt when no launch recorded.
std::optional<Trace> take_last();

}  // namespace fa4::trace
