// Position in an N-stage mbarrier ring: which stage slot, and the parity of the lap around the ring. The only place
// where the index wraps and the phase flips; kernels advance it with ++ and never do the bookkeeping inline.
//
// mbarrier parity rule (PTX ISA, mbarrier.try_wait.parity): a barrier starts in phase 0; try_wait.parity(p)
// succeeds once the phase with parity p has completed, i.e. while the barrier's current phase parity differs
// from p. On lap L of the ring a stage's barrier is in phase L, so a waiter of lap L waits with parity L & 1.
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"

namespace fa4::cuda {

// Stages is a template parameter because the ring's barrier arrays and SMEM buffers are sized by it, and a
// constant wrap point is a compare-with-immediate in the hot loop.
template <int Stages>
struct PipelineState {
  static_assert(Stages >= 1, "a ring needs at least one stage");
  static_assert(Stages <= 64, "more stages than any SMEM budget allows: a configuration error");
  static constexpr int kStages = Stages;

  uint32_t index = 0;  // stage slot, 0 .. Stages-1
  uint32_t phase = 0;  // parity to wait for on this lap (0 or 1)

  FA4_HD constexpr PipelineState& operator++() {
    if (++index == static_cast<uint32_t>(Stages)) {
      index = 0;
      phase ^= 1u;
    }
    return *this;
  }

  // The state `steps` advances later (e.g. a consumer skipping ahead, or a producer lagging by a fixed distance).
  FA4_HD constexpr PipelineState advanced(uint32_t steps) const {
    PipelineState s = *this;
    const uint32_t total = index + steps;
    s.index = total % static_cast<uint32_t>(Stages);
    s.phase = phase ^ ((total / static_cast<uint32_t>(Stages)) & 1u);
    return s;
  }

  FA4_HD constexpr bool operator==(const PipelineState& o) const { return index == o.index && phase == o.phase; }
  FA4_HD constexpr bool operator!=(const PipelineState& o) const { return !(*this == o); }
};

// Consumers wait on the full barriers for phase 0 first: they block until the first fill lands.
template <int Stages>
FA4_HD constexpr PipelineState<Stages> consumer_start_state() {
  return PipelineState<Stages>{0, 0};
}

// The producer waits on the empty barriers. They are fresh (phase 0 not completed), and waiting for parity 1
// means "the phase before phase 0": it succeeds at once, so the first lap fills every stage without a release.
template <int Stages>
FA4_HD constexpr PipelineState<Stages> producer_start_state() {
  return PipelineState<Stages>{0, 1};
}

static_assert((++PipelineState<2>{1, 0}) == PipelineState<2>{0, 1}, "wrapping flips the phase");
static_assert(PipelineState<3>{}.advanced(7) == PipelineState<3>{1, 0}, "7 steps over 3 stages = 2 laps + 1");

}  // namespace fa4::cuda
