// Host-side checks of the primitive layer under src/cuda: the wgmma shared-memory descriptor words, the 128B
// swizzle and fragment index maps, and the PipelineState phase sequences (plus a host model of the mbarrier ring
// that shows the start states neither deadlock nor overwrite unread stages). No CUDA needed.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <utility>
#include <vector>

#include "cuda/pipeline/pipeline_state.hpp"
#include "cuda/ptx/swizzle.hpp"
#include "cuda/ptx/wgmma_desc.hpp"
#include "cuda/ptx/wgmma_fragment.hpp"

using fa4::cuda::PipelineState;
using fa4::ptx::SmemSwizzle;
using fa4::ptx::WgmmaDesc;

// ---- wgmma descriptor -------------------------------------------------------------------------------------

// Q tile (K-major, 128B swizzle) at shared address 0x400:
//   start = 0x400 >> 4 = 0x40                       -> bits 0-13
//   LBO   = 16 >> 4 = 1 (unused for swizzled K-major) -> 1 << 16        = 0x0000000000010000
//   SBO   = 1024 >> 4 = 64 = 0x40                    -> 0x40 << 32     = 0x0000004000000000
//   128B swizzle = 1                                 -> 1 << 62        = 0x4000000000000000
//   total                                                                0x4000004000010040
TEST(WgmmaDesc, KMajorSw128QTile) {
  const WgmmaDesc d = fa4::ptx::sw128_k_major_desc(0x400);
  EXPECT_EQ(d.bits, 0x4000004000010040ull) << to_string(d);
  EXPECT_EQ(d.start_address(), 0x400u);
  EXPECT_EQ(d.lbo_bytes(), 16u);
  EXPECT_EQ(d.sbo_bytes(), 1024u);
  EXPECT_EQ(d.base_offset(), 0u);
  EXPECT_EQ(d.swizzle(), SmemSwizzle::b128);
}

// V tile of FA3's hdim-128 / kBlockN-176 config as the MN-major B operand, at shared address 0x9000:
//   start = 0x9000 >> 4 = 0x900
//   LBO   = 176 rows * 128 B = 22528 = 0x5800; >> 4 = 0x580 -> 0x580 << 16 = 0x0000000005800000
//   SBO   = 1024 >> 4 = 0x40                               -> 0x0000004000000000
//   swizzle 1                                              -> 0x4000000000000000
//   total                                                     0x4000004005800900
// (reference/fa3.md §3.3 lists CuTe's fields for this tile: LBO field 1408 = 0x580, SBO field 64, layout 1.)
TEST(WgmmaDesc, MnMajorSw128VTileOfKBlock176) {
  const WgmmaDesc d = fa4::ptx::sw128_mn_major_desc(0x9000, 176 * 128);
  EXPECT_EQ(d.bits, 0x4000004005800900ull) << to_string(d);
  EXPECT_EQ((d.bits >> 16) & 0x3FFF, 1408u);
  EXPECT_EQ((d.bits >> 32) & 0x3FFF, 64u);
  EXPECT_EQ(d.lbo_bytes(), 22528u);
}

// k-steps of the Q descriptor above (64 rows): k-step 3 = 3 * 16 elements * 2 B = 96 B -> start field 0x40 + 6;
// k-step 4 enters the second 64-column chunk, 64 rows * 128 B = 8192 B later -> start field 0x40 + 0x200.
TEST(WgmmaDesc, AdvanceMovesOnlyTheStartField) {
  const WgmmaDesc q = fa4::ptx::sw128_k_major_desc(0x400);
  EXPECT_EQ(q.advanced(96).bits, 0x4000004000010046ull);
  EXPECT_EQ(q.advanced(8192).bits, 0x4000004000010240ull);
  // the largest shared address stays inside the 14-bit field: 0x400 + 0x3FB00 = 0x3FF00 -> field 0x3FF0
  EXPECT_EQ(q.advanced(0x3FB00).start_address(), 0x3FF00u);
  EXPECT_EQ(q.advanced(0x3FB00).lbo_bytes(), 16u);
  // V (MN-major) k-step = 16 rows * 128 B = 2048 B -> start field + 0x80
  EXPECT_EQ(fa4::ptx::sw128_mn_major_desc(0x9000, 22528).advanced(2048).bits, 0x4000004005800980ull);
}

// Every field at once, at its extreme:
//   start 0x3FFF0 >> 4 = 0x3FFF                -> 0x0000000000003FFF
//   LBO 0x100 >> 4 = 0x10 -> << 16              = 0x0000000000100000
//   SBO 0x200 >> 4 = 0x20 -> << 32              = 0x0000002000000000
//   base offset 5 -> 5 << 49                    = 0x000A000000000000
//   64B swizzle = 2 -> 2 << 62                  = 0x8000000000000000
//   total                                         0x800A002000103FFF
TEST(WgmmaDesc, AllFieldsAndSwizzleModes) {
  const WgmmaDesc d = WgmmaDesc::make(0x3FFF0, 0x100, 0x200, SmemSwizzle::b64, 5);
  EXPECT_EQ(d.bits, 0x800A002000103FFFull) << to_string(d);
  EXPECT_EQ(d.base_offset(), 5u);
  EXPECT_EQ(d.swizzle(), SmemSwizzle::b64);
  EXPECT_EQ(WgmmaDesc::make(0, 0, 0, SmemSwizzle::b32).bits, 0xC000000000000000ull);   // 3 << 62
  EXPECT_EQ(WgmmaDesc::make(0, 0, 0, SmemSwizzle::b128).bits, 0x4000000000000000ull);  // 1 << 62
  EXPECT_EQ(WgmmaDesc::make(0, 0, 0, SmemSwizzle::none).bits, 0ull);
  // The start address keeps 18 address bits: 0x40400 encodes like 0x400.
  EXPECT_EQ(WgmmaDesc::make(0x40400, 16, 1024, SmemSwizzle::b128).bits, 0x4000004000010040ull);
}

TEST(WgmmaDesc, ToStringNamesEveryField) {
  EXPECT_EQ(to_string(fa4::ptx::sw128_k_major_desc(0x400)),
            "WgmmaDesc{0x4000004000010040: start 0x400, lbo 16, sbo 1024, base_offset 0, swizzle 128B}");
}

static_assert(fa4::ptx::sw128_k_major_desc(0x400).bits == 0x4000004000010040ull, "constexpr on the host");

// ---- swizzle and fragment maps (what the GPU tests decode with) -------------------------------------------

TEST(WgmmaDescSwizzle, Sw128IsAPermutationOf16ByteChunksInsideEachAtom) {
  for (uint32_t row = 0; row < 16; ++row) {
    std::set<uint32_t> chunks;
    for (uint32_t col = 0; col < 64; col += 8) {
      const uint32_t off = fa4::ptx::sw128_offset(row, col, 2);
      EXPECT_EQ(off / 128, row) << "a row stays in its own 128-byte line";
      EXPECT_EQ(off % 16, 0u);
      chunks.insert((off % 128) / 16);
      EXPECT_EQ((off % 128) / 16, (col / 8) ^ (row % 8)) << "row " << row << " col " << col;
    }
    EXPECT_EQ(chunks.size(), 8u);
  }
}

TEST(WgmmaDescFragment, AccumulatorCoversThe64xNTileOnce) {
  for (int n : {64, 176, 256}) {
    std::vector<int> hits(64 * n, 0);
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < n / 2; ++i) ++hits[fa4::ptx::accumulator_row(t, i) * n + fa4::ptx::accumulator_col(t, i)];
    for (int e = 0; e < 64 * n; ++e)
      ASSERT_EQ(hits[e], 1) << "N=" << n << " element (" << e / n << ", " << e % n << ")";
  }
}

TEST(WgmmaDescFragment, AFragmentIsTheAccumulatorSliceOfItsKBlock) {
  for (int t = 0; t < 128; ++t)
    for (int kb = 0; kb < 11; ++kb)
      for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h) {
          const int src = fa4::ptx::fragment_a_source_reg(kb, j, h);
          EXPECT_EQ(fa4::ptx::fragment_a_row(t, j), fa4::ptx::accumulator_row(t, src));
          EXPECT_EQ(fa4::ptx::fragment_a_col(t, j, h) + 16 * kb, fa4::ptx::accumulator_col(t, src));
        }
}

// ---- PipelineState ------------------------------------------------------------------------------------------

template <int S>
void expect_sequence(PipelineState<S> st, uint32_t start_phase) {
  for (uint32_t i = 0; i < 7 * S + 2; ++i) {  // several wraps, ending mid-lap
    ASSERT_EQ(st.index, i % S) << "step " << i << " of a " << S << "-stage ring";
    ASSERT_EQ(st.phase, start_phase ^ ((i / S) & 1u)) << "step " << i << " of a " << S << "-stage ring";
    ++st;
  }
}

TEST(PipelineState, ConsumerPhasesOverSeveralWraps) {
  expect_sequence(fa4::cuda::consumer_start_state<2>(), 0);
  expect_sequence(fa4::cuda::consumer_start_state<3>(), 0);
  expect_sequence(fa4::cuda::consumer_start_state<5>(), 0);
}

TEST(PipelineState, ProducerStartsOnTheOppositeParity) {
  expect_sequence(fa4::cuda::producer_start_state<2>(), 1);
  expect_sequence(fa4::cuda::producer_start_state<3>(), 1);
  expect_sequence(fa4::cuda::producer_start_state<5>(), 1);
}

template <int S>
void expect_advanced_matches_increments() {
  for (uint32_t start = 0; start < S; ++start)
    for (uint32_t phase = 0; phase < 2; ++phase)
      for (uint32_t n = 0; n < 4 * S + 3; ++n) {
        PipelineState<S> stepped{start, phase};
        for (uint32_t k = 0; k < n; ++k) ++stepped;
        ASSERT_EQ(PipelineState<S>({start, phase}).advanced(n), stepped)
            << S << " stages, from (" << start << ", " << phase << ") by " << n;
      }
}

TEST(PipelineState, AdvancedEqualsRepeatedIncrement) {
  expect_advanced_matches_increments<2>();
  expect_advanced_matches_increments<3>();
  expect_advanced_matches_increments<5>();
}

// Host model of an mbarrier: phase number starts at 0; a phase completes after `expected` arrivals;
// try_wait.parity(p) succeeds when the current (incomplete) phase's parity differs from p.
struct ModelBarrier {
  int expected = 1, pending = 1;
  uint32_t phase = 0;
  void arrive() {
    if (--pending == 0) {
      ++phase;
      pending = expected;
    }
  }
  bool try_wait(uint32_t parity) const { return (phase & 1u) != parity; }
};

// One producer and two consumers walk the ring in a random interleaving, with the start states above. Each item
// must reach both consumers in order, no stage may be refilled before both released it, and the run must never
// reach a state where nobody can move.
template <int S>
void run_model_ring(uint32_t seed) {
  constexpr int kConsumers = 2, kItems = 40;
  std::vector<ModelBarrier> full(S), empty(S);
  for (auto& b : empty) b.expected = b.pending = kConsumers;
  std::vector<int> slot(S, -1), unread(S, 0);
  auto prod = fa4::cuda::producer_start_state<S>();
  PipelineState<S> cons[kConsumers] = {fa4::cuda::consumer_start_state<S>(), fa4::cuda::consumer_start_state<S>()};
  int produced = 0, consumed[kConsumers] = {0, 0};
  std::mt19937 rng(seed);
  while (consumed[0] < kItems || consumed[1] < kItems) {
    bool moved = false;
    for (int tries = 0; tries < 8 && !moved; ++tries) {
      const int actor = static_cast<int>(rng() % (kConsumers + 1));
      if (actor == kConsumers) {
        if (produced < kItems && empty[prod.index].try_wait(prod.phase)) {
          ASSERT_EQ(unread[prod.index], 0) << "stage " << prod.index << " refilled before both consumers read it";
          slot[prod.index] = produced++;
          unread[prod.index] = kConsumers;
          full[prod.index].arrive();
          ++prod;
          moved = true;
        }
      } else {
        auto& st = cons[actor];
        if (consumed[actor] < kItems && full[st.index].try_wait(st.phase)) {
          ASSERT_EQ(slot[st.index], consumed[actor]) << "consumer " << actor << " read a stale or future stage";
          ++consumed[actor];
          --unread[st.index];
          empty[st.index].arrive();
          ++st;
          moved = true;
        }
      }
    }
    if (!moved) {  // random picks may all have been blocked actors: check properly before calling it a deadlock
      const bool producer_can = produced < kItems && empty[prod.index].try_wait(prod.phase);
      bool consumer_can = false;
      for (int c = 0; c < kConsumers; ++c)
        consumer_can |= consumed[c] < kItems && full[cons[c].index].try_wait(cons[c].phase);
      ASSERT_TRUE(producer_can || consumer_can)
          << "deadlock: produced " << produced << ", consumed " << consumed[0] << "/" << consumed[1];
    }
  }
}

TEST(PipelineStateModelRing, StartStatesNeitherDeadlockNorOverwrite) {
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    run_model_ring<2>(seed);
    run_model_ring<3>(seed);
    run_model_ring<5>(seed);
  }
}
