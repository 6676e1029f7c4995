// The online-softmax update with FA4's conditional rescale (reference/fa4.md §4), shared by the CPU backend
// and the GPU softmax/correction roles.
//
// Scores are kept in log2 units: x = s * log2(e) (s after scale and softcap). Each row carries a reference
// max m (possibly stale) and the sum l of exp2(x - m). When a new block's max exceeds m by more than tau, the
// reference moves and O, l are multiplied by exp2(m_old - m_new); otherwise m stays, so P = exp2(x - m) may
// reach 2^tau, which bf16/fp16 P and fp32 l, O hold easily. Exact after the final O / l, since P, l and O all
// use the same m. tau = 0 is the classic always-rescale rule.
#pragma once

#include <cmath>

#include "numerics/host_device.hpp"

namespace fa4::num {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Scale (and optional softcap) of a raw dot product q.k, into log2 units.
struct ScoreTransform {
  float scale_log2 = 0.0f;  // scale * log2(e), used without softcap
  float cap_pre = 0.0f;     // scale / softcap
  float cap_post = 0.0f;    // softcap * log2(e)
  bool softcap = false;

  static ScoreTransform make(float scale, float softcap_value) {
    ScoreTransform t;
    t.scale_log2 = scale * kLog2e;
    t.softcap = softcap_value > 0.0f;
    if (t.softcap) {
      t.cap_pre = scale / softcap_value;
      t.cap_post = softcap_value * kLog2e;
    }
    return t;
  }
  FA4_HD float operator()(float qk) const { return softcap ? cap_post * tanhf(qk * cap_pre) : qk * scale_log2; }
};

struct RowMaxUpdate {
  float m = -INFINITY;        // the reference max to use for this block and after it
  float log2_scale = 0.0f;    // O and l are multiplied by exp2(log2_scale) when rescaled
  bool rescaled = false;
};

// m_old: the row's current reference max (-inf before any visible key); block_max: the max of this block's
// visible x (-inf if none). tau >= 0 in log2 units.
FA4_HD RowMaxUpdate update_row_max(float m_old, float block_max, float tau) {
  // Selects, not branches: the GPU callers reduce two rows at once, and branches (with the quad shuffles'
  // convergence) kept the compiler from overlapping them (perf-log F41).
  const bool first = m_old == -INFINITY;  // first visible block: nothing accumulated, nothing to rescale
  const bool move = !first && block_max - m_old > tau;
  RowMaxUpdate u;
  u.m = first || move ? block_max : m_old;
  u.log2_scale = move ? m_old - block_max : 0.0f;
  u.rescaled = move;
  return u;
}

// The subtrahend for exp2(x - m): a row with no visible key yet has m = -inf, and exp2(-inf - -inf) would be
// NaN; using 0 makes every masked x (= -inf) give exactly 0.
FA4_HD float safe_max(float m) { return m == -INFINITY ? 0.0f : m; }

struct RowFinal {
  float inv_l = 0.0f;      // multiply O by this
  float lse = -INFINITY;   // natural log
};

// A fully masked row (l == 0) gives O = 0 and LSE = -inf.
FA4_HD RowFinal finalize_row(float m, float l) {
  RowFinal r;
  if (!(l > 0.0f)) return r;
  r.inv_l = 1.0f / l;
  r.lse = (m + log2f(l)) * kLn2;
  return r;
}

}  // namespace fa4::num
