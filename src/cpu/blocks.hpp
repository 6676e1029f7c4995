// Shared pieces of the CPU forward and backward: work lists (heaviest first), tile loaders, and the score
// step (scale, softcap, mask) applied to one block of S.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "api/problem.hpp"
#include "cpu/tensor_io.hpp"
#include "cpu/tiles.hpp"
#include "numerics/online_softmax.hpp"

namespace fa4::cpu {

struct WorkItem {
  int64_t b = 0, h = 0, block = 0;  // h: query head (forward, dQ) or kv head (dK/dV); block: q or kv block
  int64_t cost = 0;
};

// Visible keys of rows [i0, i1) together: the union of their ranges (both ends are monotone in i).
struct KeySpan {
  int64_t begin, end;
};
inline KeySpan keys_of_rows(const num::Mask& m, int64_t i0, int64_t i1) {
  return {m.key_begin(i0), std::max(m.key_begin(i0), m.key_end(i1 - 1))};
}
inline int64_t first_block_start(int64_t key) { return key / kBlockKeys * kBlockKeys; }

// Sorted heaviest first so that dynamic scheduling finishes the long causal rows early (LPT).
inline void sort_heaviest_first(std::vector<WorkItem>& items) {
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
}

// (b, query head, q block) items, cost = visible kv blocks.
inline std::vector<WorkItem> query_block_items(const detail::Problem& p) {
  std::vector<WorkItem> items;
  const int64_t nq = (p.seqlen_q + kBlockRows - 1) / kBlockRows;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t qb = 0; qb < nq; ++qb) {
        const int64_t i0 = qb * kBlockRows, i1 = std::min(p.seqlen_q, i0 + kBlockRows);
        const KeySpan ks = keys_of_rows(p.mask, i0, i1);
        const int64_t cost = ks.end > ks.begin ? (ks.end - first_block_start(ks.begin) + kBlockKeys - 1) / kBlockKeys : 0;
        items.push_back({b, h, qb, cost});
      }
  sort_heaviest_first(items);
  return items;
}

// Rows [r0, r0 + n) of a [b, s, h, :] tensor into tile[kBlockRows][dpad] (fp32); rows >= n are zeroed.
inline void load_row_tile(const Tensor& t, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t d, int64_t dpad,
                          float* tile, int64_t tile_rows) {
  for (int64_t r = 0; r < tile_rows; ++r) {
    float* dst = tile + r * dpad;
    if (r < n)
      load_row(t, b, r0 + r, h, d, dst);
    else
      std::fill(dst, dst + d, 0.0f);
  }
}

// S row (raw q.k for keys j0..j0+width) -> x = scores in log2 units, -inf where masked or past the end.
// `tanh_out` (optional) receives tanh(q.k * scale / softcap) for the softcap derivative.
inline void score_row(const detail::Problem& p, const num::ScoreTransform& st, int64_t i, int64_t j0, bool all_visible,
                      float* s, float* tanh_out, int width = kBlockKeys) {
  if (st.softcap) {
    for (int j = 0; j < width; ++j) {
      const float t = std::tanh(s[j] * st.cap_pre);
      if (tanh_out) tanh_out[j] = t;
      s[j] = st.cap_post * t;
    }
  } else {
    for (int j = 0; j < width; ++j) s[j] *= st.scale_log2;
  }
  if (all_visible) return;
  const int64_t kb = p.mask.key_begin(i), ke = p.mask.key_end(i);
  for (int j = 0; j < width; ++j) {
    const int64_t key = j0 + j;
    s[j] = (key >= kb && key < ke) ? s[j] : -INFINITY;
  }
}

// Whether every key of [j0, j0 + width) is visible to every row of [i0, i1).
inline bool block_fully_visible(const detail::Problem& p, int64_t i0, int64_t i1, int64_t j0, int width = kBlockKeys) {
  const int64_t j1 = j0 + width;
  return j1 <= p.seqlen_k && j0 >= p.mask.key_begin(i1 - 1) && j1 <= p.mask.key_end(i0);
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace fa4::cpu
