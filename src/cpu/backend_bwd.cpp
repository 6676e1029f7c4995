// CPU backward, deterministic and free of atomics, in two passes over recomputed P = exp2(x - LSE):
//   pass 1, one task per (batch, kv head, kv block): dV += P^T dO, dK += dS^T Q over the q blocks of every
//           query head of the group (the task owns its dK, dV rows);
//   pass 2, one task per (batch, query head, q block): dQ += dS K over the visible kv blocks.
// with dP = dO V^T, dS = P (dP - D) [x (1 - tanh^2) with softcap] x scale, and D = rowsum(dO o O).
// Recomputing S and dP in pass 2 costs 3 of the 7 products, and buys parallelism over every head and block
// without a dQ reduction. The products come from a policy, as in the forward: fp32 vector kernels, or AMX
// bf16 tiles for bf16 inputs (P and dS rounded to bf16 for their products, as on the GPU).
#include <cmath>

#include "cpu/amx.hpp"
#include "cpu/backend.hpp"
#include "cpu/blocks.hpp"
#include "cpu/packed.hpp"
#include "cpu/reference.hpp"

namespace fa4::cpu {
namespace {

// fp32 vector kernels; q-side tiles [kBlockRows][padded_dim], accumulators [64][padded_dim].
struct Fp32Products {
  int64_t d, dpad;
  PackedBlocks kt, vt, krows, q_rows, dout_rows;
  Fp32Products(const detail::Problem& prob, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout)
      : d(prob.head_dim), dpad(padded_dim(prob.head_dim)), kt(prob, k, BlockLayout::transposed),
        vt(prob, v, BlockLayout::transposed), krows(prob, k, BlockLayout::rows),
        q_rows(prob, q, BlockLayout::rows, Side::queries), dout_rows(prob, dout, BlockLayout::rows, Side::queries) {}
  int64_t acc_stride() const { return dpad; }
  int64_t padded_rows(int64_t n) const { return round_up(n, kRowGroup); }

  struct Thread {
    const float *q = nullptr, *dout = nullptr;  // the current q block's packed tiles
    Scratch pt, dst;
    explicit Thread(const Fp32Products&) : pt(kBlockKeys * kBlockRows), dst(kBlockKeys * kBlockRows) {}
  };
  void select_query_block(Thread& t, int64_t b, int64_t h, int64_t qb) const {
    t.q = q_rows.block<float>(b, h, qb);
    t.dout = dout_rows.block<float>(b, h, qb);
  }
  void scores(Thread& t, int64_t b, int64_t hk, int64_t blk, int64_t rows, float* s, float* dp) const {
    gemm_rows_by_keys(t.q, dpad, kt.block<float>(b, hk, blk), d, rows, s);
    gemm_rows_by_keys(t.dout, dpad, vt.block<float>(b, hk, blk), d, rows, dp);
  }
  void accumulate_kv(Thread& t, const float* probs, const float* ds, int64_t rows, float* dk, float* dv) const {
    transpose(probs, rows, t.pt.data());
    transpose(ds, rows, t.dst.data());
    gemm_accumulate(t.pt.data(), kBlockRows, t.dout, rows, kBlockKeys, dpad, dv);
    gemm_accumulate(t.dst.data(), kBlockRows, t.q, rows, kBlockKeys, dpad, dk);
  }
  void accumulate_q(Thread&, int64_t b, int64_t hk, int64_t blk, const float* ds, int64_t rows, float* dq) const {
    gemm_accumulate(ds, kBlockKeys, krows.block<float>(b, hk, blk), kBlockKeys, rows, dpad, dq);
  }
  static void transpose(const float* src, int64_t rows, float* dst) {  // [rows][keys] -> [keys][kBlockRows]
    for (int64_t r = 0; r < rows; ++r)
      for (int j = 0; j < kBlockKeys; ++j) dst[j * kBlockRows + r] = src[r * kBlockKeys + j];
  }
};

// AMX bf16 tiles; every tile has 64 rows. Q and dO are kept row-major (A of S, dP) and in pair layout
// along rows (B of dK += dS^T Q, dV += P^T dO).
struct AmxProducts {
  int64_t d, d32;
  PackedBlocks k_dims, v_dims, k_keys, q_rows, q_pairs, dout_rows, dout_pairs;
  AmxProducts(const detail::Problem& prob, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout)
      : d(prob.head_dim), d32(dim32(prob.head_dim)), k_dims(prob, k, BlockLayout::dim_pairs),
        v_dims(prob, v, BlockLayout::dim_pairs), k_keys(prob, k, BlockLayout::key_pairs),
        q_rows(prob, q, BlockLayout::bf16_rows, Side::queries), q_pairs(prob, q, BlockLayout::key_pairs, Side::queries),
        dout_rows(prob, dout, BlockLayout::bf16_rows, Side::queries),
        dout_pairs(prob, dout, BlockLayout::key_pairs, Side::queries) {}
  int64_t acc_stride() const { return d32; }
  int64_t padded_rows(int64_t) const { return amx::kRows; }

  struct Thread {
    const uint16_t *q = nullptr, *q_pairs = nullptr, *dout = nullptr, *dout_pairs = nullptr;
    std::vector<uint16_t> a;  // P^T, dS^T or dS in bf16
    std::vector<float> at;
    explicit Thread(const AmxProducts&) : a(kBlockKeys * kBlockRows), at(kBlockKeys * kBlockRows) { amx::configure_thread(); }
    ~Thread() { amx::release_thread(); }
  };
  void select_query_block(Thread& t, int64_t b, int64_t h, int64_t qb) const {
    t.q = q_rows.block<uint16_t>(b, h, qb);
    t.q_pairs = q_pairs.block<uint16_t>(b, h, qb);
    t.dout = dout_rows.block<uint16_t>(b, h, qb);
    t.dout_pairs = dout_pairs.block<uint16_t>(b, h, qb);
  }
  void scores(Thread& t, int64_t b, int64_t hk, int64_t blk, int64_t, float* s, float* dp) const {
    amx::gemm64(t.q, d32, k_dims.block<uint16_t>(b, hk, blk), kBlockKeys, d32, s, kBlockKeys, false);
    amx::gemm64(t.dout, d32, v_dims.block<uint16_t>(b, hk, blk), kBlockKeys, d32, dp, kBlockKeys, false);
  }
  void transposed_bf16(Thread& t, const float* src) const {  // [rows][keys] fp32 -> [keys][rows] bf16
    for (int64_t r = 0; r < kBlockRows; ++r)
      for (int j = 0; j < kBlockKeys; ++j) t.at[j * kBlockRows + r] = src[r * kBlockKeys + j];
    amx::to_bf16(t.at.data(), t.a.data(), kBlockKeys * kBlockRows);
  }
  void accumulate_kv(Thread& t, const float* probs, const float* ds, int64_t, float* dk, float* dv) const {
    transposed_bf16(t, probs);
    amx::gemm64(t.a.data(), kBlockRows, t.dout_pairs, d32, kBlockRows, dv, d32, true);
    transposed_bf16(t, ds);
    amx::gemm64(t.a.data(), kBlockRows, t.q_pairs, d32, kBlockRows, dk, d32, true);
  }
  void accumulate_q(Thread& t, int64_t b, int64_t hk, int64_t blk, const float* ds, int64_t, float* dq) const {
    amx::to_bf16(ds, t.a.data(), kBlockRows * kBlockKeys);
    amx::gemm64(t.a.data(), kBlockKeys, k_keys.block<uint16_t>(b, hk, blk), d32, kBlockKeys, dq, d32, true);
  }
};
static_assert(kBlockRows == amx::kRows && kBlockKeys == amx::kRows, "the AMX path works on whole 64x64 blocks");

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
          // One fma chain in column order, as each lane of the fp32 dP = dO V^T product runs: where O = V
          // exactly (a single visible key) dP - D is then exactly 0, as it is mathematically.
          float acc = 0.0f;
          for (int64_t c = 0; c < d; ++c) acc = std::fma(g[c], a[c], acc);
          dsum[(b * p.heads_q + h) * p.seqlen_q + i] = acc;
        }
  }
  return dsum;
}

// The per-thread state of one q block against one kv block: S -> P and dP -> dS in place.
struct RowState {
  Scratch s, dp, t;
  std::vector<float> lse2, dsum;  // per row: LSE in log2 units (+inf for a row with no visible key), D
  RowState() : s(kBlockRows * kBlockKeys), dp(kBlockRows * kBlockKeys), t(kBlockRows * kBlockKeys), lse2(kBlockRows), dsum(kBlockRows) {}

  void load(const detail::Problem& p, const Tensor& lse, const std::vector<float>& dsums, int64_t b, int64_t h, int64_t i0,
            int64_t n) {
    for (int64_t r = 0; r < kBlockRows; ++r) {
      // A row with no visible key has LSE = -inf: its P must be 0, not exp2(-inf + inf); padding rows too.
      const float l = r < n ? lse_at(lse, b, h, i0 + r) : -INFINITY;
      lse2[r] = l == -INFINITY ? INFINITY : l * num::kLog2e;
      dsum[r] = r < n ? dsums[(b * p.heads_q + h) * p.seqlen_q + i0 + r] : 0.0f;
    }
  }
  // s holds raw S, dp raw dP for rows [0, rows): s <- P, dp <- dS (times scale).
  void probabilities_and_grad(const detail::Problem& p, const num::ScoreTransform& st, int64_t i0, int64_t n,
                              int64_t rows, int64_t j0) {
    const bool all_visible = block_fully_visible(p, i0, i0 + n, j0);
    for (int64_t r = 0; r < rows; ++r) {
      float* x = s.data() + r * kBlockKeys;
      float* g = dp.data() + r * kBlockKeys;
      const float* th = t.data() + r * kBlockKeys;
      score_row(p, st, i0 + r, j0, all_visible, x, st.softcap ? t.data() + r * kBlockKeys : nullptr);
      for (int j = 0; j < kBlockKeys; ++j) x[j] = num::exp2_accurate(x[j] - lse2[r]);
      const float dr = dsum[r];
      if (st.softcap) {
        for (int j = 0; j < kBlockKeys; ++j) g[j] = x[j] * (g[j] - dr) * (1.0f - th[j] * th[j]) * p.scale;
      } else {
        for (int j = 0; j < kBlockKeys; ++j) g[j] = x[j] * (g[j] - dr) * p.scale;
      }
    }
  }
};

// dsink_h = -sum over batch and rows of P_sink D = -sum exp(sink_h - LSE) D (the sink's value is zero, so its dP
// is 0); a row that sees no key has O = 0, so D = 0 there.
void sink_gradient(const detail::Problem& p, const Tensor& lse, const std::vector<float>& dsums) {
  for (int64_t h = 0; h < p.heads_q; ++h) {
    const double sink = sink_logit(p, h);
    double sum = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const double row_lse = lse_at(lse, b, h, i);
        if (row_lse == -INFINITY) continue;  // no key and a sink of -inf: nothing in the row (exp(-inf + inf) is NaN)
        sum -= std::exp(sink - row_lse) * double(dsums[(b * p.heads_q + h) * p.seqlen_q + i]);
      }
    vector_at(*p.dsinks, h) = float(sum);
  }
}

template <class Products>
void backward_blocks(const detail::Problem& p, const Tensor& out, const Tensor& dout, const Tensor& lse,
                     const Tensor& dq, const Tensor& dk, const Tensor& dv, const Products& prod) {
  const int64_t d = p.head_dim, astride = prod.acc_stride();
  const auto st = num::ScoreTransform::make(p.scale, p.softcap);
  const std::vector<float> dsums = row_dots(p, out, dout);
  if (p.dsinks) sink_gradient(p, lse, dsums);
  const int64_t nq = (p.seqlen_q + kBlockRows - 1) / kBlockRows;

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
    typename Products::Thread thread(prod);
    RowState rs;
    Scratch dk_acc(kBlockKeys * astride), dv_acc(kBlockKeys * astride);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < kv_items.size(); ++it) {
      const WorkItem& w = kv_items[it];
      const int64_t j0 = w.block * kBlockKeys, nk = std::min<int64_t>(kBlockKeys, p.seqlen_k - j0);
      std::fill(dk_acc.data(), dk_acc.data() + kBlockKeys * astride, 0.0f);
      std::fill(dv_acc.data(), dv_acc.data() + kBlockKeys * astride, 0.0f);
      for (int64_t h = w.h * p.group(); h < (w.h + 1) * p.group(); ++h) {
        for (int64_t qb = 0; qb < nq; ++qb) {
          const int64_t i0 = qb * kBlockRows, n = std::min<int64_t>(kBlockRows, p.seqlen_q - i0);
          const KeySpan ks = keys_of_rows(p.mask, i0, i0 + n);
          if (!(ks.begin < j0 + nk && ks.end > j0)) continue;
          const int64_t rows = prod.padded_rows(n);
          prod.select_query_block(thread, w.b, h, qb);
          rs.load(p, lse, dsums, w.b, h, i0, n);
          prod.scores(thread, w.b, w.h, w.block, rows, rs.s.data(), rs.dp.data());
          rs.probabilities_and_grad(p, st, i0, n, rows, j0);
          prod.accumulate_kv(thread, rs.s.data(), rs.dp.data(), rows, dk_acc.data(), dv_acc.data());
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        store_row(dk, w.b, j0 + j, w.h, d, dk_acc.data() + j * astride);
        store_row(dv, w.b, j0 + j, w.h, d, dv_acc.data() + j * astride);
      }
    }
  }

  // Pass 2: dQ.
  const std::vector<WorkItem> q_items = query_block_items(p);
#pragma omp parallel
  {
    typename Products::Thread thread(prod);
    RowState rs;
    Scratch dq_acc(kBlockRows * astride);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < q_items.size(); ++it) {
      const WorkItem& w = q_items[it];
      const int64_t hk = w.h / p.group();
      const int64_t i0 = w.block * kBlockRows, n = std::min<int64_t>(kBlockRows, p.seqlen_q - i0);
      const int64_t rows = prod.padded_rows(n);
      prod.select_query_block(thread, w.b, w.h, w.block);
      rs.load(p, lse, dsums, w.b, w.h, i0, n);
      std::fill(dq_acc.data(), dq_acc.data() + kBlockRows * astride, 0.0f);
      const KeySpan keys = keys_of_rows(p.mask, i0, i0 + n);
      for (int64_t j0 = first_block_start(keys.begin); j0 < keys.end; j0 += kBlockKeys) {
        const int64_t blk = j0 / kBlockKeys;
        prod.scores(thread, w.b, hk, blk, rows, rs.s.data(), rs.dp.data());
        rs.probabilities_and_grad(p, st, i0, n, rows, j0);
        prod.accumulate_q(thread, w.b, hk, blk, rs.dp.data(), rows, dq_acc.data());
      }
      for (int64_t r = 0; r < n; ++r) store_row(dq, w.b, i0 + r, w.h, d, dq_acc.data() + r * astride);
    }
  }
}

}  // namespace

void backward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  if (p.dtype == DType::f64) {  // computed exactly, in fp64
    reference_backward(p, q, k, v, dout, dq, dk, dv, Precision::exact);
    return;
  }
  if (p.dtype == DType::bf16 && amx::available())
    backward_blocks(p, out, dout, lse, dq, dk, dv, AmxProducts(p, q, k, v, dout));
  else
    backward_blocks(p, out, dout, lse, dq, dk, dv, Fp32Products(p, q, k, v, dout));
}

}  // namespace fa4::cpu
