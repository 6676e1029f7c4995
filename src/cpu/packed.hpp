// K and V converted once and cut into kv blocks in the layouts the micro-kernels read, shared (read-only)
// by every q block and query head that visits them. Converting per visit instead cost the forward about a
// third of its time (docs/perf-log.md).
#pragma once

#include <cstring>
#include <memory>

#include "api/problem.hpp"
#include "cpu/amx.hpp"
#include "cpu/tensor_io.hpp"
#include "cpu/tiles.hpp"

namespace fa4::cpu {

enum class BlockLayout {
  transposed,  // fp32 [head_dim][kBlockKeys]: B of S = Q K^T (and dP = dO V^T), vector kernels
  rows,        // fp32 [kBlockKeys][padded_dim]: B of O += P V (and dQ += dS K), vector kernels
  dim_pairs,   // bf16 [dim32 / 2][kBlockKeys][2]: B of S = Q K^T for amx::gemm64 (pairs along head_dim)
  key_pairs,   // bf16 [kBlockKeys / 2][dim32][2]: B of O += P V for amx::gemm64 (pairs along keys)
  bf16_rows,   // bf16 [kBlockKeys][dim32]: an A operand for amx::gemm64 (Q, dO in the backward)
};

// Which sequence a tensor runs along: the keys (K, V: seqlen_k, heads_kv) or the queries (Q, dO: seqlen_q,
// heads_q). Blocks are kBlockKeys = kBlockRows = 64 rows either way.
enum class Side { keys, queries };
static_assert(kBlockKeys == kBlockRows, "query-side and key-side blocks share one packing");

// head_dim rounded up to whole AMX tile rows (32 bf16).
inline int64_t dim32(int64_t d) { return (d + 31) / 32 * 32; }

class PackedBlocks {
 public:
  PackedBlocks(const detail::Problem& p, const Tensor& t, BlockLayout layout, Side side = Side::keys);
  // Block `blk` (keys blk * kBlockKeys ...) of kv head h in batch b; padding keys and columns are zero.
  template <class T>
  const T* block(int64_t b, int64_t h, int64_t blk) const {
    return reinterpret_cast<const T*>(data_.get()) + ((b * heads_ + h) * blocks_ + blk) * block_elems_;
  }

 private:
  int64_t heads_, blocks_, block_elems_;
  std::unique_ptr<std::byte[]> data_;  // every element, padding included, is written by the pack
};

inline PackedBlocks::PackedBlocks(const detail::Problem& p, const Tensor& t, BlockLayout layout, Side side)
    : heads_(side == Side::keys ? p.heads_kv : p.heads_q) {
  const int64_t seqlen = side == Side::keys ? p.seqlen_k : p.seqlen_q;
  blocks_ = (seqlen + kBlockKeys - 1) / kBlockKeys;
  const int64_t d = p.head_dim, dpad = padded_dim(d), d32 = dim32(d);
  const bool bf16 = layout == BlockLayout::dim_pairs || layout == BlockLayout::key_pairs || layout == BlockLayout::bf16_rows;
  block_elems_ = layout == BlockLayout::transposed ? d * kBlockKeys
               : layout == BlockLayout::rows       ? kBlockKeys * dpad
                                                   : kBlockKeys * d32;
  const size_t esize = bf16 ? sizeof(uint16_t) : sizeof(float);
  data_.reset(new std::byte[std::max<size_t>(1, static_cast<size_t>(p.batch * heads_ * blocks_ * block_elems_) * esize)]);
#pragma omp parallel
  {
    std::vector<float> row(dpad);
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < heads_; ++h)
        for (int64_t blk = 0; blk < blocks_; ++blk) {
          const int64_t base = ((b * heads_ + h) * blocks_ + blk) * block_elems_;
          float* f = reinterpret_cast<float*>(data_.get()) + base;
          uint16_t* u = reinterpret_cast<uint16_t*>(data_.get()) + base;
          if (bf16) std::memset(u, 0, static_cast<size_t>(block_elems_) * sizeof(uint16_t));
          const int64_t j0 = blk * kBlockKeys, n = std::min<int64_t>(kBlockKeys, seqlen - j0);
          for (int64_t j = 0; j < kBlockKeys; ++j) {
            if (j < n)
              load_row(t, b, j0 + j, h, d, row.data());  // exact: bf16 -> fp32 -> bf16 round-trips
            else
              std::fill(row.begin(), row.end(), 0.0f);
            switch (layout) {
              case BlockLayout::transposed:
                for (int64_t c = 0; c < d; ++c) f[c * kBlockKeys + j] = row[c];
                break;
              case BlockLayout::rows:
                std::fill(row.begin() + d, row.end(), 0.0f);
                std::copy(row.begin(), row.end(), f + j * dpad);
                break;
              case BlockLayout::dim_pairs:
                for (int64_t c = 0; c < d; ++c) u[((c / 2) * kBlockKeys + j) * 2 + c % 2] = num::float_to_bf16_bits(row[c]);
                break;
              case BlockLayout::key_pairs:
                for (int64_t c = 0; c < d; ++c) u[((j / 2) * d32 + c) * 2 + j % 2] = num::float_to_bf16_bits(row[c]);
                break;
              case BlockLayout::bf16_rows:
                for (int64_t c = 0; c < d; ++c) u[j * d32 + c] = num::float_to_bf16_bits(row[c]);
                break;
            }
          }
        }
  }
}

}  // namespace fa4::cpu
