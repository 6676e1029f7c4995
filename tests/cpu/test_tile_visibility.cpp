// The forward's interior run (cuda/sm90/visibility.hpp): fully_visible_run's closed form against
// tile_pair_fully_visible, the definition, for every K/V tile of random masks (causal, windows, unequal lengths,
// tails), tile shapes of the sm_90a rows, and key ranges cut as split-KV and the steady state cut them; and
// rows_kv_end (a consumer warpgroup's own end, perf-log F49) against the mask's per-element definition.
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <random>

#include "cuda/sm90/visibility.hpp"

namespace {

// Random masks: causal, windows, unequal lengths, tails.
struct RandomMask {
  fa4::num::Mask mask;
  bool causal;
  int64_t left, right;
};
RandomMask random_mask(std::mt19937_64& rng) {
  const int64_t sq = 1 + int64_t(rng() % 700), sk = int64_t(rng() % 900);
  const int kind = int(rng() % 4);
  const bool causal = kind == 1 || kind == 3;
  const int64_t left = kind >= 2 ? int64_t(rng() % 300) : -1, right = kind == 2 ? int64_t(rng() % 50) : -1;
  return {fa4::num::Mask::make(sq, sk, causal, left, right), causal, left, right};
}
std::ostream& operator<<(std::ostream& os, const RandomMask& c) {
  return os << "sq " << c.mask.seqlen_q << " sk " << c.mask.seqlen_k << " causal " << c.causal << " window ("
            << c.left << ", " << c.right << ")";
}

// f(mask, m, first, last) for every query tile m of BlockM rows of `cases` random masks, each with a random cut
// [first, last) of the K/V tiles of BlockN keys (a split-KV part, or the steady state's [begin + 1, end)).
template <int BlockM, int BlockN, class F>
void for_each_query_tile(std::mt19937_64& rng, int cases, F&& f) {
  for (int i = 0; i < cases; ++i) {
    const RandomMask c = random_mask(rng);
    const int64_t sq = c.mask.seqlen_q, sk = c.mask.seqlen_k;
    const int32_t m_blocks = int32_t((sq + BlockM - 1) / BlockM), n_tiles = int32_t((sk + BlockN - 1) / BlockN);
    for (int32_t m = 0; m < m_blocks; ++m) {
      const int32_t first = n_tiles ? int32_t(rng() % uint64_t(n_tiles + 1)) : 0;
      const int32_t last = first + (n_tiles > first ? int32_t(rng() % uint64_t(n_tiles - first + 1)) : 0);
      f(c, m, first, last);
    }
  }
}

template <int BlockM, int BlockN>
void check_shape(std::mt19937_64& rng, int cases) {
  for_each_query_tile<BlockM, BlockN>(rng, cases, [](const RandomMask& c, int32_t m, int32_t first, int32_t last) {
    const fa4::sm90::TileRun run = fa4::sm90::fully_visible_run<BlockM, BlockN>(c.mask, m, first, last);
    ASSERT_LE(first, run.begin);
    ASSERT_LE(run.begin, run.end);
    ASSERT_LE(run.end, last);
    for (int32_t n = first; n < last; ++n)
      ASSERT_EQ(n >= run.begin && n < run.end, (fa4::sm90::tile_pair_fully_visible<BlockM, BlockN>(c.mask, m, n)))
          << "tile (" << m << ", " << n << ") of " << BlockM << "x" << BlockN << ", " << c << ", range [" << first
          << ", " << last << ")";
  });
}

TEST(TileVisibility, ClosedFormRunIsTheDefinition) {
  std::mt19937_64 rng(42);
  check_shape<128, 128>(rng, 400);  // d = 64 short, d = 128
  check_shape<192, 128>(rng, 400);  // d = 64 long
  check_shape<192, 112>(rng, 400);  // a block_n that is not a power of two
  check_shape<64, 128>(rng, 400);   // d = 128 decode
  check_shape<128, 96>(rng, 400);   // d = 192
  check_shape<128, 64>(rng, 400);   // d = 256
}

// rows_kv_end for every 64-row group of a tile of BlockM rows: no valid row of the group sees a key of the tiles
// from the end on (they may be skipped), the end stays inside [first, last], and the tile before it holds a key
// some valid row of the group sees (nothing visible is left out, and nothing more is walked than needed).
template <int BlockM, int BlockN>
void check_rows_end(std::mt19937_64& rng, int cases) {
  for_each_query_tile<BlockM, BlockN>(rng, cases, [](const RandomMask& c, int32_t m, int32_t first, int32_t last) {
    const fa4::num::Mask& mask = c.mask;
    for (int g = 0; g < BlockM / 64; ++g) {
      const int64_t row0 = int64_t(m) * BlockM + 64 * g;
      const int32_t end = fa4::sm90::rows_kv_end(mask, row0, 64, BlockN, first, last);
      const auto seen = [&](int32_t n) {  // some valid row of the group sees a key of tile n
        for (int64_t r = row0; r < row0 + 64 && r < mask.seqlen_q; ++r)
          for (int64_t k = int64_t(n) * BlockN; k < (int64_t(n) + 1) * BlockN && k < mask.seqlen_k; ++k)
            if (mask.visible(r, k)) return true;
        return false;
      };
      const auto where = [&] {
        return ::testing::Message() << "rows [" << row0 << ", +64) of " << BlockM << "x" << BlockN << ", " << c
                                    << ", range [" << first << ", " << last << "), end " << end;
      };
      ASSERT_LE(first, end) << where();
      ASSERT_LE(end, last) << where();
      for (int32_t n = end; n < last; ++n) ASSERT_FALSE(seen(n)) << "tile " << n << " " << where();
      if (end > first) {
        ASSERT_TRUE(seen(end - 1)) << where();
      }
    }
  });
}

TEST(TileVisibility, ConsumerRowsEndIsTheDefinition) {
  std::mt19937_64 rng(7);
  check_rows_end<128, 128>(rng, 150);  // d = 64 short, d = 128
  check_rows_end<192, 128>(rng, 150);  // d = 64 long
  check_rows_end<128, 96>(rng, 150);   // d = 192
  check_rows_end<128, 64>(rng, 150);   // d = 256
}

}  // namespace
