// Split-KV: the rule that merges the partial results of key ranges computed separately (Options::num_splits).
// Range s gives O_s (normalised over its own keys) and lse_s = log of its softmax denominator; a range in which
// the row sees no key has lse_s = -inf and contributes nothing. The merged row is
//   lse = log(sum_s exp(lse_s) [+ exp(sink)]),   O = sum_s exp(lse_s - lse) * O_s,
// computed around the largest lse_s so that no exp overflows. A row that sees no key in any range (and has no
// sink) gets lse = -inf and O = 0. An attention sink joins the denominator once, here, never per range.
#pragma once

#include <cmath>

#include "numerics/host_device.hpp"

namespace fa4::num {

// Accumulates the ranges of one row: add() each lse_s, then finish(), then weight(lse_s) for each O_s.
template <class T>
struct LseMerge {
  T max = -INFINITY;  // the largest lse_s seen (or the sink)
  T sum = 0;          // sum of exp(lse_s - max)
  T lse = -INFINITY;  // after finish()

  FA4_HD void add(T lse_s) {
    if (lse_s == T(-INFINITY)) return;
    if (lse_s > max) {
      sum = sum * std::exp(max - lse_s) + T(1);
      max = lse_s;
    } else {
      sum += std::exp(lse_s - max);
    }
  }
  // Joins another accumulation's ranges (a parallel merge: each lane adds some ranges, then the lanes' states
  // are joined pairwise); the same lse as adding them all here, up to rounding.
  FA4_HD void add_state(T other_max, T other_sum) {
    if (!(other_sum > T(0))) return;
    if (other_max > max) {
      sum = sum * std::exp(max - other_max) + other_sum;
      max = other_max;
    } else {
      sum += other_sum * std::exp(other_max - max);
    }
  }
  FA4_HD void finish() { lse = sum > T(0) ? max + std::log(sum) : T(-INFINITY); }
  // The factor of range s's O in the merged O (0 for an empty range, and for every range of an empty row).
  FA4_HD T weight(T lse_s) const { return lse_s == T(-INFINITY) ? T(0) : std::exp(lse_s - lse); }
};

}  // namespace fa4::num
