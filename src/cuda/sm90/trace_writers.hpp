// Which thread records for which role in a trace build of the sm_90a kernels (cuda/trace/recorder.cuh), and
// the names the host gives those writer slots. Host and device read the same constants.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fa4::sm90 {

// Forward: the TMA warp's elected lane, then one per consumer warpgroup (its thread 0).
inline constexpr uint32_t kFwdTraceLoadWriter = 0;
constexpr uint32_t fwd_trace_consumer_writer(int consumer) { return 1 + uint32_t(consumer); }

// Backward: the TMA warp's elected lane, the dQ writer warp's elected lane (key-split rows), then one per
// consumer warpgroup (its thread 0).
inline constexpr uint32_t kBwdTraceLoadWriter = 0;
inline constexpr uint32_t kBwdTraceDqWriter = 1;
constexpr uint32_t bwd_trace_consumer_writer(int consumer) { return 2 + uint32_t(consumer); }

inline std::vector<std::string> fwd_trace_writer_names(int consumers) {
  std::vector<std::string> names{"load"};
  for (int c = 0; c < consumers; ++c) names.push_back("consumer " + std::to_string(c));
  return names;
}

inline std::vector<std::string> bwd_trace_writer_names(int consumers) {
  std::vector<std::string> names{"load", "dq writer"};
  for (int c = 0; c < consumers; ++c) names.push_back("consumer " + std::to_string(c));
  return names;
}

}  // namespace fa4::sm90
