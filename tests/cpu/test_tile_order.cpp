// The persistent sm_90a forward's tile orders (src/cuda/sm90/tile_order.hpp), checked on the host: each is a
// permutation of the (query block, head, batch) tiles; the causal (LPT) order runs section by section, longest
// rows first inside a section; the static order keeps a head's query blocks together; split-KV ranges of a tile
// are consecutive.
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <vector>

#include "cuda/sm90/tile_order.hpp"

using fa4::sm90::TileOrder;
using fa4::sm90::WorkTile;

namespace {

TileOrder order(int32_t blocks, int32_t heads, int32_t batch, bool lpt, int32_t section) {
  TileOrder o;
  o.num_m_blocks = blocks, o.heads_q = heads, o.batch = batch, o.lpt = lpt, o.lpt_section = section;
  return o;
}

void expect_permutation(const TileOrder& o) {
  std::set<std::tuple<int32_t, int32_t, int32_t>> seen;
  for (int32_t n = 0; n < o.num_tiles(); ++n) {
    const WorkTile t = o.tile(n);
    ASSERT_TRUE(t.m_block >= 0 && t.m_block < o.num_m_blocks && t.head >= 0 && t.head < o.heads_q && t.batch >= 0 &&
                t.batch < o.batch)
        << "tile " << n << " out of range";
    EXPECT_TRUE(seen.emplace(t.m_block, t.head, t.batch).second) << "tile " << n << " visited twice";
  }
  EXPECT_EQ(int64_t(seen.size()), int64_t(o.num_tiles()));
}

}  // namespace

TEST(TileOrder, BothOrdersArePermutations) {
  for (int32_t blocks : {1, 2, 7, 33})
    for (int32_t heads : {1, 3, 16})
      for (int32_t batch : {1, 2, 5}) {
        SCOPED_TRACE(std::to_string(blocks) + " blocks, " + std::to_string(heads) + " heads, batch " +
                     std::to_string(batch));
        expect_permutation(order(blocks, heads, batch, false, 1));
        for (int32_t section : {1, 2, 5, 12, heads * batch})  // uneven last sections included
          if (section <= heads * batch) expect_permutation(order(blocks, heads, batch, true, section));
      }
}

TEST(TileOrder, LptRunsSectionBySectionLongestFirst) {
  const TileOrder o = order(10, 16, 2, true, 12);  // 32 pairs: sections of 12, 12 and 8
  int32_t previous_section = 0, previous_block = o.num_m_blocks;
  for (int32_t n = 0; n < o.num_tiles(); ++n) {
    const WorkTile t = o.tile(n);
    const int32_t section = (t.batch * o.heads_q + t.head) / o.lpt_section;
    ASSERT_GE(section, previous_section) << "tile " << n << " goes back to an earlier section";
    if (section != previous_section) previous_block = o.num_m_blocks;
    EXPECT_LE(t.m_block, previous_block) << "tile " << n << ": a longer (later) query block after a shorter one";
    previous_section = section, previous_block = t.m_block;
  }
  EXPECT_EQ(o.tile(0).m_block, 9);                    // the longest rows first
  EXPECT_EQ(o.tile(o.num_tiles() - 1).m_block, 0);    // the shortest last
}

TEST(TileOrder, StaticKeepsAHeadsQueryBlocksTogether) {
  const TileOrder o = order(8, 4, 3, false, 1);
  for (int32_t n = 0; n < o.num_tiles(); ++n) {
    const WorkTile t = o.tile(n);
    EXPECT_EQ(t.m_block, n % 8);
    EXPECT_EQ(t.batch * 4 + t.head, n / 8);
  }
}


// Split-KV: the split index runs fastest, so `splits` consecutive tiles (a cluster of consecutive CTAs, each its
// blockIdx's tile: FwdParams::cluster_combine) are the ranges 0 .. splits - 1 of one (query block, head, batch),
// and every range of every tile appears once.
TEST(TileOrder, SplitRangesOfATileAreConsecutive) {
  for (int32_t splits : {2, 3, 7, 16}) {
    TileOrder o = order(3, 5, 2, false, 1);
    o.num_splits = splits;
    ASSERT_EQ(o.num_tiles(), 3 * 5 * 2 * splits);
    std::set<std::tuple<int32_t, int32_t, int32_t, int32_t>> seen;
    for (int32_t n = 0; n < o.num_tiles(); ++n) {
      const WorkTile t = o.tile(n), first = o.tile(n - n % splits);
      EXPECT_EQ(t.split, n % splits) << n;
      EXPECT_TRUE(t.m_block == first.m_block && t.head == first.head && t.batch == first.batch)
          << "tile " << n << " is not its cluster's tile";
      EXPECT_TRUE(seen.emplace(t.m_block, t.head, t.batch, t.split).second) << "tile " << n << " visited twice";
    }
  }
}
