// CPU forward: for each (batch, head, q block), stream the visible kv blocks through S = Q K^T, the online
// softmax with conditional rescale, and O += P V; then O / l and the LSE.
#include <cmath>

#include "cpu/backend.hpp"
#include "cpu/blocks.hpp"
#include "cpu/packed.hpp"
#include "cpu/reference.hpp"

namespace fa4::cpu {

void forward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
             const Tensor* lse) {
  if (p.dtype == DType::f64) {  // computed exactly, in fp64
    reference_forward(p, q, k, v, out, lse, Precision::exact);
    return;
  }
  const int64_t d = p.head_dim, dpad = padded_dim(d);
  const auto st = num::ScoreTransform::make(p.scale, p.softcap);
  const std::vector<WorkItem> items = query_block_items(p);
  const PackedBlocks kt_blocks(p, k, BlockLayout::transposed), v_blocks(p, v, BlockLayout::rows);

#pragma omp parallel
  {
    Scratch qt(kBlockRows * dpad), s(kBlockRows * kBlockKeys), o(kBlockRows * dpad);
    std::vector<float> m(kBlockRows), l(kBlockRows);

#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < items.size(); ++it) {
      const WorkItem& w = items[it];
      const int64_t hk = w.h / p.group();
      const int64_t i0 = w.block * kBlockRows, n = std::min<int64_t>(kBlockRows, p.seqlen_q - i0);
      const int64_t rows = round_up(n, kRowGroup);
      load_row_tile(q, w.b, w.h, i0, n, d, dpad, qt.data(), rows);
      std::fill(o.data(), o.data() + kBlockRows * dpad, 0.0f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);

      const KeySpan keys = keys_of_rows(p.mask, i0, i0 + n);
      for (int64_t j0 = first_block_start(keys.begin); j0 < keys.end; j0 += kBlockKeys) {
        const int64_t blk = j0 / kBlockKeys;
        gemm_rows_by_keys(qt.data(), dpad, kt_blocks.block(w.b, hk, blk), d, rows, s.data());

        const bool all_visible = block_fully_visible(p, i0, i0 + n, j0);
        for (int64_t r = 0; r < rows; ++r) {
          float* x = s.data() + r * kBlockKeys;
          score_row(p, st, i0 + r, j0, all_visible, x, nullptr);
          const num::RowMaxUpdate u = num::update_row_max(m[r], max_block(x), p.rescale_threshold);
          if (u.rescaled) {
            const float f = num::exp2_accurate(u.log2_scale);
            l[r] *= f;
            for (int64_t c = 0; c < d; ++c) o.data()[r * dpad + c] *= f;
          }
          m[r] = u.m;
          l[r] += exp2_block(x, num::safe_max(u.m), j0, p.exp2_emulated_per16);
        }
        gemm_accumulate(s.data(), kBlockKeys, v_blocks.block(w.b, hk, blk), kBlockKeys, rows, dpad, o.data());
      }

      for (int64_t r = 0; r < n; ++r) {
        const num::RowFinal fin = num::finalize_row(m[r], l[r]);
        float* orow = o.data() + r * dpad;
        for (int64_t c = 0; c < d; ++c) orow[c] *= fin.inv_l;
        store_row(out, w.b, i0 + r, w.h, d, orow);
        if (lse) lse_at(*lse, w.b, w.h, i0 + r) = fin.lse;
      }
    }
  }
}

}  // namespace fa4::cpu
