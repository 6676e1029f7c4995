// K and V converted once to fp32 and cut into kv blocks in the layouts the micro-kernels read, shared
// (read-only) by every q block and query head that visits them. Converting per visit instead cost the
// forward about a third of its time (docs/perf-log.md).
#pragma once

#include <memory>

#include "api/problem.hpp"
#include "cpu/tensor_io.hpp"
#include "cpu/tiles.hpp"

namespace fa4::cpu {

enum class BlockLayout {
  transposed,  // [head_dim][kBlockKeys]: the B operand of S = Q K^T (and dP = dO V^T)
  rows,        // [kBlockKeys][padded head_dim]: the B operand of O += P V (and dQ += dS K)
};

class PackedBlocks {
 public:
  PackedBlocks(const detail::Problem& p, const Tensor& t, BlockLayout layout);
  // Block `blk` (keys blk * kBlockKeys ...) of kv head h in batch b; padding keys and columns are zero.
  const float* block(int64_t b, int64_t h, int64_t blk) const {
    return data_.get() + ((b * heads_ + h) * blocks_ + blk) * block_floats_;
  }

 private:
  int64_t heads_, blocks_, block_floats_;
  std::unique_ptr<float[]> data_;  // uninitialised: the parallel pack writes every float, padding included
};

inline PackedBlocks::PackedBlocks(const detail::Problem& p, const Tensor& t, BlockLayout layout)
    : heads_(p.heads_kv), blocks_((p.seqlen_k + kBlockKeys - 1) / kBlockKeys) {
  const int64_t d = p.head_dim, dpad = padded_dim(d);
  block_floats_ = layout == BlockLayout::transposed ? d * kBlockKeys : kBlockKeys * dpad;
  data_.reset(new float[static_cast<size_t>(std::max<int64_t>(1, p.batch * heads_ * blocks_ * block_floats_))]);
#pragma omp parallel
  {
    std::vector<float> row(dpad);
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < heads_; ++h)
        for (int64_t blk = 0; blk < blocks_; ++blk) {
          float* dst = data_.get() + ((b * heads_ + h) * blocks_ + blk) * block_floats_;
          const int64_t j0 = blk * kBlockKeys, n = std::min<int64_t>(kBlockKeys, p.seqlen_k - j0);
          for (int64_t j = 0; j < kBlockKeys; ++j) {
            if (j < n)
              load_row(t, b, j0 + j, h, d, row.data());
            else
              std::fill(row.begin(), row.end(), 0.0f);
            if (layout == BlockLayout::transposed) {
              for (int64_t c = 0; c < d; ++c) dst[c * kBlockKeys + j] = row[c];
            } else {
              std::fill(row.begin() + d, row.end(), 0.0f);
              std::copy(row.begin(), row.end(), dst + j * dpad);
            }
          }
        }
  }
}

}  // namespace fa4::cpu
