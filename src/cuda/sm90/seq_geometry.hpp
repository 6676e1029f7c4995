// The sequence a unit of work belongs to, for both sm_90a passes: the whole problem for a dense batch, one
// sequence of a variable-length batch (its sizes, its rows' offsets in the packed tensors, the mask on its
// sizes), or one sequence of a KV-cache call.
#pragma once

#include <cstdint>

#include "numerics/mask.hpp"

namespace fa4::sm90 {

struct SeqGeometry {
  num::Mask mask;
  int32_t seqlen_q = 0, seqlen_k = 0;
  int32_t q_row0 = 0, k_row0 = 0;  // the sequence's first row in packed q / out / lse and in packed k / v
};

}  // namespace fa4::sm90
