#include "cpu/split_kv.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/backend.hpp"
#include "cpu/tensor_io.hpp"
#include "cpu/tiles.hpp"
#include "numerics/split_merge.hpp"

namespace fa4::cpu {
namespace {

// Keys [j0, j1) of a [b, s, h, d] tensor.
Tensor key_range(const Tensor& t, int64_t j0, int64_t j1) {
  Tensor r = t;
  r.data = static_cast<char*>(t.data) + j0 * t.stride[1] * int64_t(element_size(t.dtype));
  r.shape[1] = j1 - j0;
  return r;
}

// p restricted to keys [j0, j1), indexed from j0. The mask keeps only offset() = seqlen_k - seqlen_q, so
// giving it seqlen_q' = seqlen_q - (seqlen_k - j1) and seqlen_k' = j1 - j0 moves the key origin to j0 without
// changing which (row, key) pairs are visible. The sinks join the merge, not the ranges.
detail::Problem range_problem(const detail::Problem& p, int64_t j0, int64_t j1) {
  detail::Problem r = p;
  r.seqlen_k = j1 - j0;
  r.mask.seqlen_q = p.mask.seqlen_q - (p.mask.seqlen_k - j1);
  r.mask.seqlen_k = j1 - j0;
  r.sinks = nullptr;
  r.dsinks = nullptr;
  r.num_splits = 1;
  return r;
}

}  // namespace

int64_t split_ranges(const detail::Problem& p) {
  const int64_t blocks = (p.seqlen_k + kBlockKeys - 1) / kBlockKeys;
  return std::max<int64_t>(1, std::min<int64_t>(p.num_splits, blocks));
}

void forward_split(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor* lse) {
  const int64_t n = split_ranges(p), blocks = (p.seqlen_k + kBlockKeys - 1) / kBlockKeys;
  const int64_t d = p.head_dim, rows = p.batch * p.seqlen_q * p.heads_q;
  std::vector<float> o_storage(size_t(n * rows * d));
  std::vector<float> lse_storage(size_t(n * rows));
  std::vector<Tensor> o_parts, lse_parts;
  for (int64_t s = 0; s < n; ++s) {
    // Whole kv blocks, spread as evenly as they go: range s is blocks [s * blocks / n, (s + 1) * blocks / n).
    const int64_t j0 = s * blocks / n * kBlockKeys, j1 = std::min(p.seqlen_k, (s + 1) * blocks / n * kBlockKeys);
    o_parts.push_back(Tensor::contiguous(o_storage.data() + s * rows * d, DType::f32, Device::cpu,
                                         {p.batch, p.seqlen_q, p.heads_q, d}));
    lse_parts.push_back(
        Tensor::contiguous3(lse_storage.data() + s * rows, DType::f32, Device::cpu, {p.batch, p.heads_q, p.seqlen_q}));
    forward(range_problem(p, j0, j1), q, key_range(k, j0, j1), key_range(v, j0, j1), o_parts.back(), &lse_parts.back());
  }

#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      std::vector<double> acc(static_cast<size_t>(d)), part(static_cast<size_t>(d));
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        num::LseMerge<double> merge;
        for (int64_t s = 0; s < n; ++s) merge.add(lse_at(lse_parts[size_t(s)], b, h, i));
        if (p.sinks) merge.add(sink_logit(p, h));
        merge.finish();
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t s = 0; s < n; ++s) {
          const double w = merge.weight(lse_at(lse_parts[size_t(s)], b, h, i));
          if (w == 0) continue;
          load_row(o_parts[size_t(s)], b, i, h, d, part.data());
          for (int64_t c = 0; c < d; ++c) acc[size_t(c)] += w * part[size_t(c)];
        }
        store_row(out, b, i, h, d, acc.data());
        if (lse) lse_at(*lse, b, h, i) = static_cast<float>(merge.lse);
      }
    }
}

}  // namespace fa4::cpu
