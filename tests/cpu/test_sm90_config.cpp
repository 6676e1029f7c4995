// The sm_90a tile table's row choice (src/cuda/sm90/config.hpp), host-only: which kernel a (head dim, query
// length) runs. The kernels themselves are checked on the GPU (tests/gpu), each row over the whole sweep.
#include <gtest/gtest.h>

#include "cuda/sm90/config.hpp"

namespace {

using fa4::sm90::fwd_row;
using fa4::sm90::kFwdTiles;

int block_m(int head_dim, int64_t seqlen_q) {
  const int row = fwd_row(head_dim, seqlen_q);
  return row < 0 ? -1 : kFwdTiles[row].block_m;
}

TEST(Sm90TileTable, D64TakesTwoConsumerWarpgroupsUpTo1024QueriesAndThreeBeyond) {
  for (int64_t s : {1, 17, 512, 1000, 1024}) EXPECT_EQ(block_m(64, s), 128) << "seqlen_q " << s;
  for (int64_t s : {int64_t{1025}, int64_t{2048}, int64_t{4224}, int64_t{1} << 30}) EXPECT_EQ(block_m(64, s), 192) << "seqlen_q " << s;
}

TEST(Sm90TileTable, D128TakesOneConsumerWarpgroupUpTo64Queries) {
  for (int64_t s : {1, 4, 8, 64}) EXPECT_EQ(block_m(128, s), 64) << "seqlen_q " << s;
  for (int64_t s : {int64_t{65}, int64_t{1024}, int64_t{16384}}) EXPECT_EQ(block_m(128, s), 128) << "seqlen_q " << s;
}

TEST(Sm90TileTable, OtherHeadDimsHaveOneRowForEveryLength) {
  for (int d : {192, 256})
    for (int64_t s : {1, 1024, 1025, 16384}) {
      const int row = fwd_row(d, s);
      ASSERT_GE(row, 0) << "d " << d;
      EXPECT_EQ(kFwdTiles[row].head_dim, d);
      EXPECT_EQ(kFwdTiles[row].block_m, 128);
      EXPECT_EQ(row, fwd_row(d, 1)) << "d " << d << " changes rows at seqlen_q " << s;
    }
}

TEST(Sm90TileTable, HeadDimsWithoutARowHaveNone) {
  for (int d : {0, 32, 96, 100, 512}) EXPECT_EQ(fwd_row(d, 128), -1) << "d " << d;
}

}  // namespace
