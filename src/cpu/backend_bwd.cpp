// CPU backward, deterministic and free of atomics, in two passes over recomputed P = exp2(x - LSE):
//   pass 1, one task per (batch, kv head, kv block): dV += P^T dO, dK += dS^T Q over the q blocks of every
//           query head of the group (the task owns its dK, dV rows);
//   pass 2, one task per (batch, query head, q block): dQ += dS K over the visible kv blocks.
// with dP = dO V^T, dS = P (dP - D) [x (1 - tanh^2) with softcap] x scale, and D = rowsum(dO o O).
// Recomputing S and dP in pass 2 costs 3 of the 7 products, and buys parallelism over every head and block
// without a dQ reduction.
#include <cmath>

#include "cpu/backend.hpp"
#include "cpu/blocks.hpp"
#include "cpu/packed.hpp"
#include "cpu/reference.hpp"

namespace fa4::cpu {
namespace {

// The per-thread tiles of one q block against one kv block.
struct BlockTiles {
  int64_t dpad;
  Scratch q, dout, s, dp, t;
  std::vector<float> lse2, dsum;  // per row: LSE in log2 units, D
  BlockTiles(int64_t dpad_)
      : dpad(dpad_), q(kBlockRows * dpad_), dout(kBlockRows * dpad_), s(kBlockRows * kBlockKeys),
        dp(kBlockRows * kBlockKeys), t(kBlockRows * kBlockKeys), lse2(kBlockRows), dsum(kBlockRows) {}
};

// D_i = dO_i . O_i, for every (b, h, i).
std::vector<float> row_dots(const detail::Problem& p, const Tensor& out, const Tensor& dout) {
  std::vector<float> dsum(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q));
  const int64_t d = p.head_dim;
#pragma omp parallel
  {
    std::vector<float> a(d), g(d);
#pragma omp for collapse(2)
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.seqlen_q; ++i) {
          load_row(out, b, i, h, d, a.data());
          load_row(dout, b, i, h, d, g.data());
          // One fma chain in column order, as each lane of the dP = dO V^T product runs: where O = V exactly
          // (a single visible key) dP - D is then exactly 0, as it is mathematically.
          float acc = 0.0f;
          for (int64_t c = 0; c < d; ++c) acc = std::fma(g[c], a[c], acc);
          dsum[(b * p.heads_q + h) * p.seqlen_q + i] = acc;
        }
  }
  return dsum;
}

// Loads the q-side tiles of rows [i0, i0 + n) of head h.
void load_query_side(const detail::Problem& p, const Tensor& q, const Tensor& dout, const Tensor& lse,
                     const std::vector<float>& dsum, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t rows,
                     BlockTiles& bt) {
  const int64_t d = p.head_dim;
  load_row_tile(q, b, h, i0, n, d, bt.dpad, bt.q.data(), rows);
  load_row_tile(dout, b, h, i0, n, d, bt.dpad, bt.dout.data(), rows);
  for (int64_t r = 0; r < rows; ++r) {
    bt.lse2[r] = r < n ? lse_at(lse, b, h, i0 + r) * num::kLog2e : -INFINITY;
    bt.dsum[r] = r < n ? dsum[(b * p.heads_q + h) * p.seqlen_q + i0 + r] : 0.0f;
  }
}

// With kt = K^T and vt = V^T of block j0 loaded: s <- P, dp <- dS (already times scale).
void probabilities_and_grad(const detail::Problem& p, const num::ScoreTransform& st, int64_t i0, int64_t n,
                            int64_t rows, int64_t j0, const float* kt, const float* vt, BlockTiles& bt) {
  const int64_t d = p.head_dim;
  gemm_rows_by_keys(bt.q.data(), bt.dpad, kt, d, rows, bt.s.data());
  gemm_rows_by_keys(bt.dout.data(), bt.dpad, vt, d, rows, bt.dp.data());
  const bool all_visible = block_fully_visible(p, i0, i0 + n, j0);
  for (int64_t r = 0; r < rows; ++r) {
    float* x = bt.s.data() + r * kBlockKeys;
    float* g = bt.dp.data() + r * kBlockKeys;
    const float* t = bt.t.data() + r * kBlockKeys;
    score_row(p, st, i0 + r, j0, all_visible, x, st.softcap ? bt.t.data() + r * kBlockKeys : nullptr);
    // A row with no visible key has LSE = -inf: its P is 0, not exp2(-inf + inf).
    const float lse2 = bt.lse2[r] == -INFINITY ? INFINITY : bt.lse2[r];
    for (int j = 0; j < kBlockKeys; ++j) x[j] = num::exp2_accurate(x[j] - lse2);
    const float dr = bt.dsum[r];
    if (st.softcap) {
      for (int j = 0; j < kBlockKeys; ++j) g[j] = x[j] * (g[j] - dr) * (1.0f - t[j] * t[j]) * p.scale;
    } else {
      for (int j = 0; j < kBlockKeys; ++j) g[j] = x[j] * (g[j] - dr) * p.scale;
    }
  }
}

void transpose_block(const float* src, int64_t rows, float* dst) {  // [rows][kBlockKeys] -> [kBlockKeys][kBlockRows]
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < kBlockKeys; ++j) dst[j * kBlockRows + r] = src[r * kBlockKeys + j];
}

}  // namespace

void backward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  if (p.dtype == DType::f64) {  // computed exactly, in fp64
    reference_backward(p, q, k, v, dout, dq, dk, dv, Precision::exact);
    return;
  }
  const int64_t d = p.head_dim, dpad = padded_dim(d);
  const auto st = num::ScoreTransform::make(p.scale, p.softcap);
  const std::vector<float> dsum = row_dots(p, out, dout);
  const int64_t nq = (p.seqlen_q + kBlockRows - 1) / kBlockRows;
  const PackedBlocks kt_blocks(p, k, BlockLayout::transposed), vt_blocks(p, v, BlockLayout::transposed),
      k_blocks(p, k, BlockLayout::rows);

  // Pass 1: dK, dV.
  std::vector<WorkItem> kv_items;
  const int64_t nkb = (p.seqlen_k + kBlockKeys - 1) / kBlockKeys;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (int64_t kb = 0; kb < nkb; ++kb) kv_items.push_back({b, hk, kb, 0});
  for (WorkItem& w : kv_items) {  // cost: q blocks that see the kv block
    for (int64_t qb = 0; qb < nq; ++qb) {
      const KeySpan ks = keys_of_rows(p.mask, qb * kBlockRows, std::min(p.seqlen_q, (qb + 1) * kBlockRows));
      w.cost += ks.begin < (w.block + 1) * kBlockKeys && ks.end > w.block * kBlockKeys;
    }
  }
  sort_heaviest_first(kv_items);

#pragma omp parallel
  {
    BlockTiles bt(dpad);
    Scratch pt(kBlockKeys * kBlockRows), dst(kBlockKeys * kBlockRows), dk_acc(kBlockKeys * dpad), dv_acc(kBlockKeys * dpad);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < kv_items.size(); ++it) {
      const WorkItem& w = kv_items[it];
      const int64_t j0 = w.block * kBlockKeys, nk = std::min<int64_t>(kBlockKeys, p.seqlen_k - j0);
      const float* kt = kt_blocks.block<float>(w.b, w.h, w.block);
      const float* vt = vt_blocks.block<float>(w.b, w.h, w.block);
      std::fill(dk_acc.data(), dk_acc.data() + kBlockKeys * dpad, 0.0f);
      std::fill(dv_acc.data(), dv_acc.data() + kBlockKeys * dpad, 0.0f);
      for (int64_t h = w.h * p.group(); h < (w.h + 1) * p.group(); ++h) {
        for (int64_t qb = 0; qb < nq; ++qb) {
          const int64_t i0 = qb * kBlockRows, n = std::min<int64_t>(kBlockRows, p.seqlen_q - i0);
          const KeySpan ks = keys_of_rows(p.mask, i0, i0 + n);
          if (!(ks.begin < j0 + nk && ks.end > j0)) continue;
          const int64_t rows = round_up(n, kRowGroup);
          load_query_side(p, q, dout, lse, dsum, w.b, h, i0, n, rows, bt);
          probabilities_and_grad(p, st, i0, n, rows, j0, kt, vt, bt);
          transpose_block(bt.s.data(), rows, pt.data());
          transpose_block(bt.dp.data(), rows, dst.data());
          gemm_accumulate(pt.data(), kBlockRows, bt.dout.data(), rows, kBlockKeys, dpad, dv_acc.data());
          gemm_accumulate(dst.data(), kBlockRows, bt.q.data(), rows, kBlockKeys, dpad, dk_acc.data());
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        store_row(dk, w.b, j0 + j, w.h, d, dk_acc.data() + j * dpad);
        store_row(dv, w.b, j0 + j, w.h, d, dv_acc.data() + j * dpad);
      }
    }
  }

  // Pass 2: dQ.
  const std::vector<WorkItem> q_items = query_block_items(p);
#pragma omp parallel
  {
    BlockTiles bt(dpad);
    Scratch dq_acc(kBlockRows * dpad);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < q_items.size(); ++it) {
      const WorkItem& w = q_items[it];
      const int64_t hk = w.h / p.group();
      const int64_t i0 = w.block * kBlockRows, n = std::min<int64_t>(kBlockRows, p.seqlen_q - i0);
      const int64_t rows = round_up(n, kRowGroup);
      load_query_side(p, q, dout, lse, dsum, w.b, w.h, i0, n, rows, bt);
      std::fill(dq_acc.data(), dq_acc.data() + kBlockRows * dpad, 0.0f);
      const KeySpan keys = keys_of_rows(p.mask, i0, i0 + n);
      for (int64_t j0 = first_block_start(keys.begin); j0 < keys.end; j0 += kBlockKeys) {
        const int64_t blk = j0 / kBlockKeys;
        probabilities_and_grad(p, st, i0, n, rows, j0, kt_blocks.block<float>(w.b, hk, blk), vt_blocks.block<float>(w.b, hk, blk), bt);
        gemm_accumulate(bt.dp.data(), kBlockKeys, k_blocks.block<float>(w.b, hk, blk), kBlockKeys, rows, dpad, dq_acc.data());
      }
      for (int64_t r = 0; r < n; ++r) store_row(dq, w.b, i0 + r, w.h, d, dq_acc.data() + r * dpad);
    }
  }
}

}  // namespace fa4::cpu
