// Division of non-negative 31-bit integers by a divisor fixed at launch, as one multiply-high, an add and a
// shift (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994; the form CUTLASS
// calls FastDivmod). The paged forward's producer divides key offsets by the page size once per box: `/` and
// `%` by a run-time divisor compile to ~20 dependent instructions (I2F, MUFU.RCP, F2I, IMAD.HI, fix-ups), and
// one producer thread issues them serially between its TMA issues (perf-log F30).
// Host-constructed (the divisor's multiplier and shift go into the kernel parameters); div/mod run on either side.
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"

namespace fa4::cuda {

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;  // 2^32 · (2^shift − divisor) / divisor + 1 (truncated)
  uint32_t shift = 0;       // ceil(log2(divisor))

  FastDivmod() = default;
  // divisor in [1, 2^31).
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while ((uint64_t(1) << shift) < d) ++shift;
    multiplier = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }

  // n / divisor for n in [0, 2^31): the multiply-high is below n, so the sum does not wrap.
  FA4_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(n, multiplier);
#else
    const uint32_t high = uint32_t((uint64_t(n) * multiplier) >> 32);
#endif
    return (high + n) >> shift;
  }
  FA4_HD uint32_t mod(uint32_t n) const { return n - div(n) * divisor; }
};

}  // namespace fa4::cuda
