// Which K/V tiles every valid row of a query tile sees whole (host and device, so the CPU tests check the closed
// form against the definition). The forward's steady state runs those tiles through its interior softmax body
// (no mask code at all), the rest through the general one; the backward skips their per-key masking.
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"
#include "numerics/mask.hpp"

namespace fa4::sm90 {

// Whether every (query, key) of query tile m_block × key tile n_block is visible, so the softmax skips the
// per-element predicates: keys inside seqlen_k and inside every valid row's window (both window ends grow with
// the row, so the first and last valid rows decide). Rows past seqlen_q are never stored (forward) or have
// P = 0 (backward), so they do not count.
template <int BlockM, int BlockN>
FA4_HD bool tile_pair_fully_visible(const num::Mask& mask, int32_t m_block, int32_t n_block) {
  const int64_t row0 = int64_t(m_block) * BlockM;
  const int64_t row_last = (row0 + BlockM < mask.seqlen_q ? row0 + BlockM : mask.seqlen_q) - 1;
  const int64_t key0 = int64_t(n_block) * BlockN, key_end = key0 + BlockN;
  return key_end <= mask.seqlen_k && key0 >= mask.key_begin(row_last) && key_end <= mask.key_end(row0);
}

// The K/V tiles [begin, end) of [first, last) that tile_pair_fully_visible admits for query tile m_block, in
// closed form: n·block_n >= the last valid row's first key, (n + 1)·block_n <= the first row's key end and
// seqlen_k. Both window ends grow with the row, so the admitted tiles are one run (empty: begin == end).
struct TileRun {
  int32_t begin, end;
};
template <int BlockM, int BlockN>
FA4_HD TileRun fully_visible_run(const num::Mask& mask, int32_t m_block, int32_t first, int32_t last) {
  const int64_t row_first = int64_t(m_block) * BlockM;
  const int64_t row_last = (row_first + BlockM < mask.seqlen_q ? row_first + BlockM : mask.seqlen_q) - 1;
  const int64_t key_first = mask.key_begin(row_last);  // >= 0
  const int64_t key_end = mask.key_end(row_first) < mask.seqlen_k ? mask.key_end(row_first) : mask.seqlen_k;
  const int64_t lo = (key_first + BlockN - 1) / BlockN, hi = key_end / BlockN;
  TileRun run;
  run.begin = int32_t(lo < first ? first : lo > last ? last : lo);
  run.end = int32_t(hi < run.begin ? run.begin : hi > last ? last : hi);
  return run;
}

// The end of the K/V tiles [first, last) that the `rows` query rows from row0 see, clamped into [first, last]:
// first when none of the rows is valid (row0 >= the mask's seqlen_q) or sees a key of the range. Both window ends grow with
// the row, so the rows' keys lie in [key_begin(row0), key_end(last valid row)). Every tile from the end to last
// is fully masked for those rows (perf-log F49: a consumer warpgroup's own end of its tile's range).
FA4_HD int32_t rows_kv_end(const num::Mask& mask, int64_t row0, int rows, int block_n, int32_t first,
                           int32_t last) {
  const int64_t seqlen_q = mask.seqlen_q;
  if (row0 >= seqlen_q || mask.key_begin(row0) >= int64_t(last) * block_n) return first;
  const int64_t row_last = (row0 + rows < seqlen_q ? row0 + rows : seqlen_q) - 1;
  const int64_t end = (mask.key_end(row_last) + block_n - 1) / block_n;
  return int32_t(end < first ? first : end > last ? last : end);
}

}  // namespace fa4::sm90
