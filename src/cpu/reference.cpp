#include "cpu/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/tensor_io.hpp"
#include "numerics/convert.hpp"

namespace fa4::cpu {
namespace {

// Rounding applied to matrix-product results in Precision::storage.
struct Rounder {
  DType dtype;
  bool active;
  template <class T>
  T operator()(T x) const {
    if (!active) return x;
    switch (dtype) {
      case DType::bf16: return static_cast<T>(num::round_to_bf16(static_cast<float>(x)));
      case DType::f16: return static_cast<T>(num::round_to_f16(static_cast<float>(x)));
      case DType::f32: return static_cast<T>(static_cast<float>(x));
      case DType::f64: return x;
    }
    return x;
  }
};

// Scores of one query row: s_j (after scale, softcap) and tanh term for the softcap derivative;
// -inf where masked. Returns the row max.
template <class Acc>
Acc row_scores(const detail::Problem& p, const std::vector<Acc>& qrow, const std::vector<Acc>& kmat, int64_t i,
               const Rounder& rnd, std::vector<Acc>& s, std::vector<Acc>& t) {
  const int64_t d = p.head_dim;
  Acc mx = -std::numeric_limits<Acc>::infinity();
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (!p.mask.visible(i, j)) {
      s[j] = -std::numeric_limits<Acc>::infinity();
      t[j] = 0;
      continue;
    }
    Acc dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += qrow[c] * kmat[j * d + c];
    dot = rnd(dot);
    Acc u = dot * static_cast<Acc>(p.scale);
    if (p.softcap > 0.0f) {
      const Acc cap = static_cast<Acc>(p.softcap);
      t[j] = std::tanh(u / cap);
      u = cap * t[j];
    }
    s[j] = u;
    if (u > mx) mx = u;
  }
  return mx;
}

template <class Acc>
std::vector<Acc> load_head(const Tensor& x, int64_t b, int64_t h, int64_t seqlen, int64_t d) {
  std::vector<Acc> m(static_cast<size_t>(seqlen * d));
  for (int64_t j = 0; j < seqlen; ++j) load_row(x, b, j, h, d, m.data() + j * d);
  return m;
}

template <class Acc>
void forward_impl(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                  const Tensor* lse, const Rounder& rnd) {
  const int64_t d = p.head_dim;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / p.group();
      const auto kmat = load_head<Acc>(k, b, hk, p.seqlen_k, d);
      const auto vmat = load_head<Acc>(v, b, hk, p.seqlen_k, d);
      std::vector<Acc> qrow(d), s(p.seqlen_k), t(p.seqlen_k), o(d);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        load_row(q, b, i, h, d, qrow.data());
        const Acc sink = static_cast<Acc>(sink_logit(p, h));  // a key of value zero in the denominator
        const Acc mx = std::max(row_scores(p, qrow, kmat, i, rnd, s, t), sink);
        std::fill(o.begin(), o.end(), Acc(0));
        Acc l = 0;
        if (mx != -std::numeric_limits<Acc>::infinity()) {
          l = std::exp(sink - mx);
          for (int64_t j = 0; j < p.seqlen_k; ++j) {
            const Acc e = std::exp(s[j] - mx);
            l += e;
            s[j] = e;
          }
          for (int64_t j = 0; j < p.seqlen_k; ++j) {
            const Acc pj = rnd(s[j] / l);
            if (pj == 0) continue;
            for (int64_t c = 0; c < d; ++c) o[c] += pj * vmat[j * d + c];
          }
          for (int64_t c = 0; c < d; ++c) o[c] = rnd(o[c]);
        }
        store_row(out, b, i, h, d, o.data());
        if (lse) {
          lse_at(*lse, b, h, i) =
              l > 0 ? static_cast<float>(mx + std::log(l)) : -std::numeric_limits<float>::infinity();
        }
      }
    }
  }
}

// dsinks (with p.dsinks): per (b, h) the partial sums, added over the batch after the parallel loop.
template <class Acc>
void backward_impl(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                   const Tensor& dq, const Tensor& dk, const Tensor& dv, const Rounder& rnd, const Tensor* given_out) {
  std::vector<double> partial(p.dsinks ? static_cast<size_t>(p.batch * p.heads_q) : 0);
  std::vector<double>* const dsink_partial = p.dsinks ? &partial : nullptr;
  const int64_t d = p.head_dim;
  const Acc scale = static_cast<Acc>(p.scale);
  // One (b, kv head) per task: it owns dK, dV of that head and dQ of its query heads, so nothing races.
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const auto kmat = load_head<Acc>(k, b, hk, p.seqlen_k, d);
      const auto vmat = load_head<Acc>(v, b, hk, p.seqlen_k, d);
      std::vector<Acc> dkacc(static_cast<size_t>(p.seqlen_k * d), 0), dvacc(static_cast<size_t>(p.seqlen_k * d), 0);
      std::vector<Acc> qrow(d), dorow(d), dqrow(d), o(d), s(p.seqlen_k), t(p.seqlen_k), dp(p.seqlen_k);
      for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
        const Acc sink = static_cast<Acc>(sink_logit(p, h));
        Acc dsink = 0;  // -sum_i P_i,sink D_i (the sink's value is zero, so its dP is 0)
        for (int64_t i = 0; i < p.seqlen_q; ++i) {
          load_row(q, b, i, h, d, qrow.data());
          load_row(dout, b, i, h, d, dorow.data());
          std::fill(dqrow.begin(), dqrow.end(), Acc(0));
          const Acc mx = std::max(row_scores(p, qrow, kmat, i, rnd, s, t), sink);
          if (mx != -std::numeric_limits<Acc>::infinity()) {
            Acc l = std::exp(sink - mx);
            for (int64_t j = 0; j < p.seqlen_k; ++j) l += std::exp(s[j] - mx);
            // D_i = sum_j P_ij dP_ij = dO_i . O_i. In storage precision it is taken from O rounded to the dtype,
            // as any backward given the stored output computes it: with a sink (P_ij < 1 for a lone key) dP - D
            // cancels, and that rounding is most of a straightforward backward's error there. A given output
            // replaces both.
            Acc dsum = 0;
            std::fill(o.begin(), o.end(), Acc(0));
            for (int64_t j = 0; j < p.seqlen_k; ++j) {
              s[j] = rnd(std::exp(s[j] - mx) / l);  // P
              if (s[j] == 0) {
                dp[j] = 0;
                continue;
              }
              Acc acc = 0;
              for (int64_t c = 0; c < d; ++c) acc += dorow[c] * vmat[j * d + c];
              dp[j] = rnd(acc);
              if (given_out) continue;
              if (rnd.active) {
                for (int64_t c = 0; c < d; ++c) o[c] += s[j] * vmat[j * d + c];
              } else {
                dsum += s[j] * dp[j];
              }
            }
            if (given_out) {
              load_row(*given_out, b, i, h, d, o.data());
              for (int64_t c = 0; c < d; ++c) dsum += dorow[c] * o[c];
            } else if (rnd.active) {
              for (int64_t c = 0; c < d; ++c) dsum += dorow[c] * rnd(o[c]);
            }
            dsink -= std::exp(sink - mx) / l * dsum;
            for (int64_t j = 0; j < p.seqlen_k; ++j) {
              if (s[j] == 0) continue;
              Acc ds = s[j] * (dp[j] - dsum);
              if (p.softcap > 0.0f) ds *= (1 - t[j] * t[j]);
              ds = rnd(ds) * scale;
              for (int64_t c = 0; c < d; ++c) {
                dqrow[c] += ds * kmat[j * d + c];
                dkacc[j * d + c] += ds * qrow[c];
                dvacc[j * d + c] += s[j] * dorow[c];
              }
            }
          }
          for (int64_t c = 0; c < d; ++c) dqrow[c] = rnd(dqrow[c]);
          store_row(dq, b, i, h, d, dqrow.data());
        }
        if (dsink_partial) (*dsink_partial)[static_cast<size_t>(b * p.heads_q + h)] = static_cast<double>(dsink);
      }
      for (int64_t j = 0; j < p.seqlen_k; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          dkacc[j * d + c] = rnd(dkacc[j * d + c]);
          dvacc[j * d + c] = rnd(dvacc[j * d + c]);
        }
        store_row(dk, b, j, hk, d, dkacc.data() + j * d);
        store_row(dv, b, j, hk, d, dvacc.data() + j * d);
      }
    }
  }
  if (p.dsinks) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      double sum = 0;
      for (int64_t b = 0; b < p.batch; ++b) sum += partial[static_cast<size_t>(b * p.heads_q + h)];
      vector_at(*p.dsinks, h) = static_cast<float>(sum);
    }
  }
}

}  // namespace

void reference_forward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor* lse, Precision precision) {
  if (precision == Precision::exact)
    forward_impl<double>(p, q, k, v, out, lse, Rounder{p.dtype, false});
  else
    forward_impl<float>(p, q, k, v, out, lse, Rounder{p.dtype, true});
}

void reference_backward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        Precision precision, const Tensor* given_out) {
  if (precision == Precision::exact)
    backward_impl<double>(p, q, k, v, dout, dq, dk, dv, Rounder{p.dtype, false}, given_out);
  else
    backward_impl<float>(p, q, k, v, dout, dq, dk, dv, Rounder{p.dtype, true}, given_out);
}

double reference_forward_row(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             int64_t b, int64_t h, int64_t i, double* out_row) {
  const int64_t d = p.head_dim;
  const int64_t hk = h / p.group();
  const auto kmat = load_head<double>(k, b, hk, p.seqlen_k, d);
  std::vector<double> qrow(d), s(p.seqlen_k), t(p.seqlen_k), vrow(d);
  load_row(q, b, i, h, d, qrow.data());
  const double sink = sink_logit(p, h);
  const double mx = std::max(row_scores(p, qrow, kmat, i, Rounder{p.dtype, false}, s, t), sink);
  for (int64_t c = 0; c < d; ++c) out_row[c] = 0;
  if (mx == -std::numeric_limits<double>::infinity()) return -std::numeric_limits<double>::infinity();
  double l = std::exp(sink - mx);
  for (int64_t j = 0; j < p.seqlen_k; ++j) l += (s[j] = std::exp(s[j] - mx));
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (s[j] == 0) continue;
    load_row(v, b, j, hk, d, vrow.data());
    for (int64_t c = 0; c < d; ++c) out_row[c] += s[j] / l * vrow[c];
  }
  return mx + std::log(l);
}

void reference_backward_dq_row(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& dout, int64_t b, int64_t h, int64_t i, double* dq_row) {
  const int64_t d = p.head_dim;
  const int64_t hk = h / p.group();
  const auto kmat = load_head<double>(k, b, hk, p.seqlen_k, d);
  const auto vmat = load_head<double>(v, b, hk, p.seqlen_k, d);
  std::vector<double> qrow(d), dorow(d), s(p.seqlen_k), t(p.seqlen_k), dp(p.seqlen_k);
  load_row(q, b, i, h, d, qrow.data());
  load_row(dout, b, i, h, d, dorow.data());
  for (int64_t c = 0; c < d; ++c) dq_row[c] = 0;
  const double sink = sink_logit(p, h);
  const double mx = std::max(row_scores(p, qrow, kmat, i, Rounder{p.dtype, false}, s, t), sink);
  if (mx == -std::numeric_limits<double>::infinity()) return;
  double l = std::exp(sink - mx), dsum = 0;
  for (int64_t j = 0; j < p.seqlen_k; ++j) l += (s[j] = std::exp(s[j] - mx));
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    s[j] /= l;
    dp[j] = 0;
    for (int64_t c = 0; c < d; ++c) dp[j] += dorow[c] * vmat[j * d + c];
    dsum += s[j] * dp[j];
  }
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    double ds = s[j] * (dp[j] - dsum) * p.scale;
    if (p.softcap > 0.0f) ds *= 1 - t[j] * t[j];
    for (int64_t c = 0; c < d; ++c) dq_row[c] += ds * kmat[j * d + c];
  }
}

}  // namespace fa4::cpu
