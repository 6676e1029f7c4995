// Traces recorded by the real kernels on the H200 (`fa4 trace`, commit bbceed7, cut to a few CTAs with
// scripts/trace-cut): the reader, validate() and the exporters on what the GPU wrote, and the kernels'
// recording itself checked against the structure of their loops (every count below follows from the shape).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "trace/export.hpp"
#include "trace/trace.hpp"

namespace {

using fa4::trace::Event;
using fa4::trace::Kind;
using fa4::trace::Trace;

std::string data(const char* name) { return std::string(FA4_TEST_DATA_DIR) + "/" + name; }

std::map<Kind, int> kinds_between(std::span<const Event> slice, size_t begin, size_t end) {
  std::map<Kind, int> n;
  for (size_t i = begin; i < end; ++i) ++n[static_cast<Kind>(slice[i].kind)];
  return n;
}

// Each tile span of a consumer slice: [tile_begin index, tile_end index].
std::vector<std::pair<size_t, size_t>> tiles(std::span<const Event> slice) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t open = 0;
  for (size_t i = 0; i < slice.size(); ++i) {
    if (slice[i].kind == uint8_t(Kind::tile_begin)) open = i;
    if (slice[i].kind == uint8_t(Kind::tile_end)) out.emplace_back(open, i);
  }
  return out;
}

// Each writer's waits are exactly the kinds its role records, and they add up to its total wait.
void expect_waits(const fa4::trace::Summary& s, const std::map<std::string, std::vector<std::string>>& kinds) {
  for (const auto& w : s.writers) {
    std::vector<std::string> got;
    double sum = 0;
    for (const auto& [what, ns] : w.wait_ns_by) got.push_back(what), sum += ns;
    EXPECT_EQ(got, kinds.at(w.writer)) << w.writer;
    EXPECT_NEAR(sum, w.wait_ns, 1e-6 * w.wait_ns) << w.writer;
  }
}

}  // namespace

// Backward, d = 128, s = 2048, 16 heads: tile 64 queries × 128 keys, so every key block (CTA) walks all 2048/64
// = 32 query tiles (no mask); two consumer warpgroups; the dQ writer adds two slabs per tile.
TEST(TraceRecorded, BackwardD128FollowsTheKernelsLoop) {
  const Trace t = fa4::trace::read_trace(data("trace-sm90-bwd-d128-2ctas.fa4trace"));
  ASSERT_NO_THROW(fa4::trace::validate(t));
  EXPECT_EQ(t.ctas, 2u);
  EXPECT_EQ(t.writer_names, (std::vector<std::string>{"load", "dq writer", "consumer 0", "consumer 1"}));
  EXPECT_EQ(t.dropped(), 0u);
  for (uint32_t c = 0; c < t.ctas; ++c) {
    // Load: K/V once, then one Q/dO/LSE/D issue per query tile.
    const auto load = kinds_between(t.slice(c, 0), 0, t.slice(c, 0).size());
    EXPECT_EQ(load.at(Kind::tma_issue), 1 + 32) << "CTA " << c;
    // dQ writer: two slabs (one per consumer warpgroup) per query tile.
    const auto writer = kinds_between(t.slice(c, 1), 0, t.slice(c, 1).size());
    EXPECT_EQ(writer.at(Kind::dq_add), 2 * 32) << "CTA " << c;
    for (uint32_t w = 2; w < 4; ++w) {
      const auto slice = t.slice(c, w);
      const auto spans = tiles(slice);
      ASSERT_EQ(spans.size(), 32u) << "CTA " << c << " writer " << w;
      for (const auto& [b, e] : spans) {
        const auto n = kinds_between(slice, b, e + 1);
        EXPECT_EQ(n.at(Kind::s_issue), 1);
        EXPECT_EQ(n.at(Kind::s_done), 1);
        EXPECT_EQ(n.at(Kind::softmax_begin), 1);
        EXPECT_EQ(n.at(Kind::pv_issue), 1);
        EXPECT_EQ(n.at(Kind::pv_done), 1);
        EXPECT_EQ(slice[b].arg, slice[e].arg);  // the query tile
      }
      EXPECT_EQ(slice.back().kind, uint8_t(Kind::epilogue_end));
    }
  }
  const fa4::trace::Summary s = fa4::trace::summarize(t);
  EXPECT_EQ(s.writers.size(), 4u);
  // What each role waits for (default mode: the writer never waits for a turn).
  expect_waits(s, {{"load", {"stage_free"}},
                   {"dq writer", {"dq_buffer"}},
                   {"consumer 0", {"barrier", "dq_buffer", "q"}},
                   {"consumer 1", {"barrier", "dq_buffer", "q"}}});
  EXPECT_EQ(s.writers[2].tiles, 64u);
  for (const auto& w : s.writers) EXPECT_TRUE(w.busy_fraction > 0 && w.busy_fraction <= 1) << w.writer;
  EXPECT_GT(s.tensor_busy_fraction, 0);
  EXPECT_LE(s.tensor_busy_fraction, 1);
  // One named track per (CTA, writer) in the Perfetto export.
  int writer_tracks = 0;
  const nlohmann::json perfetto = fa4::trace::perfetto_json(t);
  for (const auto& e : perfetto["traceEvents"])
    if (e.value("name", "") == "thread_name" && e["args"]["name"].get<std::string>().find("·") != std::string::npos &&
        e["args"]["name"].get<std::string>().find("S=QK") == std::string::npos &&
        e["args"]["name"].get<std::string>().find("P·V") == std::string::npos)
      ++writer_tracks;
  EXPECT_EQ(writer_tracks, 8);
}

// Forward, d = 128, s = 4096, 16 heads: tile 128 × 128, so a work tile has 4096/128 = 32 K/V steps: S of every
// step, P·V of every step, a softmax per step, and a rescale decision for every step after the first.
TEST(TraceRecorded, ForwardD128FollowsTheKernelsLoop) {
  const Trace t = fa4::trace::read_trace(data("trace-sm90-fwd-d128-1cta.fa4trace"));
  ASSERT_NO_THROW(fa4::trace::validate(t));
  EXPECT_EQ(t.writer_names, (std::vector<std::string>{"load", "consumer 0", "consumer 1"}));
  EXPECT_EQ(t.dropped(), 0u);
  for (uint32_t w = 1; w < 3; ++w) {
    const auto slice = t.slice(0, w);
    const auto spans = tiles(slice);
    // 512 work tiles (32 query blocks × 16 heads) over 132 CTAs in a static stride: CTA 0 gets 4.
    ASSERT_EQ(spans.size(), 4u) << "writer " << w;
    for (const auto& [b, e] : spans) {
      auto n = kinds_between(slice, b, e + 1);
      EXPECT_EQ(n.at(Kind::s_issue), 32);
      EXPECT_EQ(n.at(Kind::pv_done), 32);
      EXPECT_EQ(n.at(Kind::softmax_end), 32);
      EXPECT_EQ(n[Kind::rescale_taken] + n[Kind::rescale_skipped], 31);
      EXPECT_EQ(n.at(Kind::epilogue_begin), 1);
    }
  }
  expect_waits(fa4::trace::summarize(t), {{"load", {"stage_free", "tile_slot"}},
                                          {"consumer 0", {"k", "tile_slot", "v"}},
                                          {"consumer 1", {"k", "tile_slot", "v"}}});
  // The load warp issued Q once and K and V 32 times per tile.
  const auto load = kinds_between(t.slice(0, 0), 0, t.slice(0, 0).size());
  EXPECT_EQ(load.at(Kind::tma_issue), 4 * (1 + 2 * 32));
  EXPECT_NE(fa4::trace::timeline_svg(t, {0}).find("</svg>"), std::string::npos);
}
