// CPU forward: for each (batch, head, q block), stream the visible kv blocks through S = Q K^T, the online
// softmax with conditional rescale, and O += P V; then O / l and the LSE. The two products come from a
// policy: fp32 vector kernels for every dtype, or AMX bf16 tiles for bf16 inputs where the CPU has them
// (P is then rounded to bf16 for P V, as on the GPU).
#include <cmath>

#include "cpu/amx.hpp"
#include "cpu/backend.hpp"
#include "cpu/blocks.hpp"
#include "cpu/packed.hpp"
#include "cpu/reference.hpp"
#include "cpu/split_kv.hpp"

namespace fa4::cpu {
namespace {

// fp32 vector kernels (tiles.hpp). Q tile and O are [kBlockRows][padded_dim] fp32.
struct Fp32Products {
  int64_t d, dpad;
  PackedBlocks kt, v;
  Fp32Products(const detail::Problem& prob, const Tensor& k, const Tensor& vv)
      : d(prob.head_dim), dpad(padded_dim(prob.head_dim)), kt(prob, k, BlockLayout::transposed),
        v(prob, vv, BlockLayout::rows) {}
  int64_t o_stride() const { return dpad; }
  int64_t padded_rows(int64_t n) const { return round_up(n, kRowGroup); }
  static constexpr int kBlocksPerStep = 1;

  struct Thread {
    Scratch q;
    explicit Thread(const Fp32Products& m) : q(kBlockRows * m.dpad) {}
  };
  void load_q(Thread& t, const Tensor& q, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t rows) const {
    load_row_tile(q, b, h, i0, n, d, dpad, t.q.data(), rows);
  }
  void scores(Thread& t, int64_t b, int64_t hk, int64_t blk, int, int64_t rows, float* s) const {
    gemm_rows_by_keys(t.q.data(), dpad, kt.block<float>(b, hk, blk), d, rows, s);
  }
  void accumulate(Thread&, int64_t b, int64_t hk, int64_t blk, int, const float* probs, int64_t rows, float* o) const {
    gemm_accumulate(probs, kBlockKeys, v.block<float>(b, hk, blk), kBlockKeys, rows, dpad, o);
  }
};

// AMX bf16 tiles (amx.hpp). Q tile and P are bf16 [64][dim32] / [64][64], O is fp32 [64][dim32].
struct AmxProducts {
  int64_t d, d32;
  PackedBlocks k_pairs, v_pairs;
  AmxProducts(const detail::Problem& prob, const Tensor& k, const Tensor& vv)
      : d(prob.head_dim), d32(dim32(prob.head_dim)), k_pairs(prob, k, BlockLayout::dim_pairs),
        v_pairs(prob, vv, BlockLayout::key_pairs) {}
  int64_t o_stride() const { return d32; }
  int64_t padded_rows(int64_t) const { return amx::kRows; }
  // Two kv blocks per step: O's accumulator tiles make one round trip through memory per 128 keys instead
  // of per 64, and the per-row softmax bookkeeping is paid half as often (docs/perf-log.md).
  static constexpr int kBlocksPerStep = 2;

  struct Thread {
    std::vector<uint16_t> q, probs;
    std::vector<float> row;
    explicit Thread(const AmxProducts& m)
        : q(amx::kRows * m.d32), probs(amx::kRows * kBlockKeys * kBlocksPerStep), row(m.d32) {
      amx::configure_thread();
    }
    ~Thread() { amx::release_thread(); }
  };
  void load_q(Thread& t, const Tensor& q, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t) const {
    std::fill(t.q.begin(), t.q.end(), uint16_t{0});
    for (int64_t r = 0; r < n; ++r) {
      load_row(q, b, i0 + r, h, d, t.row.data());
      for (int64_t c = 0; c < d; ++c) t.q[r * d32 + c] = num::float_to_bf16_bits(t.row[c]);
    }
  }
  // s is [64][nblocks * kBlockKeys]; consecutive kv blocks of a head are adjacent in the packs, so two
  // blocks of V in pair layout are one [kBlockKeys][dim32] operand with twice the depth.
  void scores(Thread& t, int64_t b, int64_t hk, int64_t blk, int nblocks, int64_t, float* s) const {
    for (int i = 0; i < nblocks; ++i)
      amx::gemm64(t.q.data(), d32, k_pairs.block<uint16_t>(b, hk, blk + i), kBlockKeys, d32, s + i * kBlockKeys,
                  nblocks * kBlockKeys, false);
  }
  void accumulate(Thread& t, int64_t b, int64_t hk, int64_t blk, int nblocks, const float* probs, int64_t,
                  float* o) const {
    const int width = nblocks * kBlockKeys;
    amx::to_bf16(probs, t.probs.data(), amx::kRows * width);
    amx::gemm64(t.probs.data(), width, v_pairs.block<uint16_t>(b, hk, blk), d32, width, o, d32, true);
  }
};
static_assert(kBlockRows == amx::kRows && kBlockKeys % amx::kPanel == 0, "the AMX path computes whole 64-row blocks");
static_assert(Fp32Products::kBlocksPerStep == 1, "the fp32 kernels' S tile is one kv block wide");

template <class Products>
void forward_blocks(const detail::Problem& p, const Tensor& q, const Tensor& out, const Tensor* lse, const Products& prod) {
  const int64_t d = p.head_dim, ostride = prod.o_stride();
  const auto st = num::ScoreTransform::make(p.scale, p.softcap);
  const std::vector<WorkItem> items = query_block_items(p);

#pragma omp parallel
  {
    typename Products::Thread thread(prod);
    Scratch s(kBlockRows * kBlockKeys * Products::kBlocksPerStep), o(kBlockRows * ostride);
    std::vector<float> m(kBlockRows), l(kBlockRows);

#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < items.size(); ++it) {
      const WorkItem& w = items[it];
      const int64_t hk = w.h / p.group();
      const int64_t i0 = w.block * kBlockRows, n = std::min<int64_t>(kBlockRows, p.seqlen_q - i0);
      const int64_t rows = prod.padded_rows(n);
      prod.load_q(thread, q, w.b, w.h, i0, n, rows);
      std::fill(o.data(), o.data() + kBlockRows * ostride, 0.0f);
      // An attention sink starts every row as a key of value zero already seen: m = its logit (log2 units), l = 1.
      const float m0 = float(sink_logit(p, w.h)) * num::kLog2e;  // -inf without a sink (or a sink of -inf)
      std::fill(m.begin(), m.end(), m0);
      std::fill(l.begin(), l.end(), m0 == -INFINITY ? 0.0f : 1.0f);

      const KeySpan keys = keys_of_rows(p.mask, i0, i0 + n);
      for (int64_t j0 = first_block_start(keys.begin); j0 < keys.end; j0 += kBlockKeys * Products::kBlocksPerStep) {
        const int64_t blk = j0 / kBlockKeys;
        const int nblocks = static_cast<int>(std::min<int64_t>(Products::kBlocksPerStep, (keys.end - j0 + kBlockKeys - 1) / kBlockKeys));
        const int width = nblocks * kBlockKeys;
        prod.scores(thread, w.b, hk, blk, nblocks, rows, s.data());
        const bool all_visible = block_fully_visible(p, i0, i0 + n, j0, width);
        for (int64_t r = 0; r < rows; ++r) {
          float* x = s.data() + r * width;
          score_row(p, st, i0 + r, j0, all_visible, x, nullptr, width);
          const num::RowMaxUpdate u = num::update_row_max(m[r], max_block(x, width), p.rescale_threshold);
          if (u.rescaled) {
            const float f = num::exp2_accurate(u.log2_scale);
            l[r] *= f;
            for (int64_t c = 0; c < d; ++c) o.data()[r * ostride + c] *= f;
          }
          m[r] = u.m;
          l[r] += exp2_block(x, num::safe_max(u.m), j0, p.exp2_emulated_per16, width);
        }
        prod.accumulate(thread, w.b, hk, blk, nblocks, s.data(), rows, o.data());
      }

      for (int64_t r = 0; r < n; ++r) {
        const num::RowFinal fin = num::finalize_row(m[r], l[r]);
        float* orow = o.data() + r * ostride;
        for (int64_t c = 0; c < d; ++c) orow[c] *= fin.inv_l;
        store_row(out, w.b, i0 + r, w.h, d, orow);
        if (lse) lse_at(*lse, w.b, w.h, i0 + r) = fin.lse;
      }
    }
  }
}

}  // namespace

void forward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
             const Tensor* lse) {
  if (p.num_splits > 1 && split_ranges(p) > 1) {  // each range comes back here with num_splits = 1
    forward_split(p, q, k, v, out, lse);
    return;
  }
  if (p.dtype == DType::f64) {  // computed exactly, in fp64
    reference_forward(p, q, k, v, out, lse, Precision::exact);
    return;
  }
  if (p.dtype == DType::bf16 && amx::available())
    forward_blocks(p, q, out, lse, AmxProducts(p, k, v));
  else
    forward_blocks(p, q, out, lse, Fp32Products(p, k, v));
}

}  // namespace fa4::cpu
