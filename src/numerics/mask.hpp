// Mask predicates, shared by every backend. Causal is bottom-right aligned (FlashAttention >= 2.1): query
// row i sees key j iff j <= i + (seqlen_k - seqlen_q). A window (left, right) keeps
// i + offset - left <= j <= i + offset + right, -1 meaning unbounded; causal is the window's right = 0.
#pragma once

#include "numerics/host_device.hpp"

namespace fa4::num {

struct Mask {
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t left = -1;   // -1: unbounded
  int64_t right = -1;  // -1: unbounded; causal folds in as right = min(right, 0)

  static Mask make(int64_t seqlen_q, int64_t seqlen_k, bool causal, int64_t window_left, int64_t window_right) {
    // A window side of seqlen_q + seqlen_k or more already admits every key; clamping it there keeps the
    // masks identical and every kernel's index arithmetic (key ± offset ± side) far from int64 overflow.
    const int64_t wide = seqlen_q + seqlen_k;
    Mask m{seqlen_q, seqlen_k, window_left > wide ? wide : window_left, window_right > wide ? wide : window_right};
    if (causal) m.right = 0;  // validation refuses causal with window_right > 0
    return m;
  }
  FA4_HD int64_t offset() const { return seqlen_k - seqlen_q; }
  FA4_HD bool masks_anything() const { return left >= 0 || right >= 0; }

  // First visible key of row i (may exceed the last: then the row sees nothing).
  FA4_HD int64_t key_begin(int64_t i) const {
    if (left < 0) return 0;
    const int64_t b = i + offset() - left;
    return b < 0 ? 0 : b;
  }
  // One past the last visible key of row i.
  FA4_HD int64_t key_end(int64_t i) const {
    if (right < 0) return seqlen_k;
    const int64_t e = i + offset() + right + 1;
    return e < 0 ? 0 : (e > seqlen_k ? seqlen_k : e);
  }
  FA4_HD bool visible(int64_t i, int64_t j) const { return j >= key_begin(i) && j < key_end(i); }
};

}  // namespace fa4::num
