// The host side of kernel traces (src/trace/): the file round trip and its rejections, validate(), dropped
// events, the Perfetto JSON, the SVG timeline and the summary, all on a small synthetic trace whose figures are
// worked out by hand below (no GPU needed).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "trace/export.hpp"
#include "trace/format.hpp"
#include "trace/trace.hpp"

using namespace fa4::trace;

namespace {

// %globaltimer-like timestamps: large enough that converting them to double before subtracting would lose ns.
constexpr uint64_t kBase = 1'700'000'000'000'000'000ull;

struct Rec {
  uint64_t t;  // ns after kBase
  Kind kind;
  int32_t arg = 0;
};

int32_t w(Wait x) { return int32_t(x); }
int32_t op(Operand x) { return int32_t(x); }

void put(Trace& t, uint32_t cta, uint32_t writer, uint16_t sm, const std::vector<Rec>& recs) {
  const size_t slot = size_t(cta) * t.writers_per_cta + writer;
  ASSERT_LE(recs.size(), t.capacity);
  t.counts[slot] = uint32_t(recs.size());
  for (size_t i = 0; i < recs.size(); ++i)
    t.events[slot * t.capacity + i] = Event{kBase + recs[i].t, sm, uint8_t(recs[i].kind), 0, recs[i].arg};
}

Trace empty_trace(uint32_t ctas, std::vector<std::string> names, uint32_t capacity) {
  Trace t;
  t.kernel = "sm90 fwd bf16 d128 <test>";
  t.shape = "b=1 h=2 s=256 causal & \"quoted\"";
  t.ctas = ctas;
  t.writers_per_cta = uint32_t(names.size());
  t.capacity = capacity;
  t.writer_names = std::move(names);
  t.counts.assign(size_t(ctas) * t.writers_per_cta, 0);
  t.events.assign(t.counts.size() * capacity, Event{});
  return t;
}

// 2 CTAs × {load, consumer 0, consumer 1}. CTA 0 runs on SM 3, CTA 1 on SM 7; times are ns after kBase.
// CTA 0's consumer 0 has the forward's steady-state interleave: S(1) issued, P·V(0) issued, S(1) done, softmax(1),
// P·V(0) done. CTA 1's consumer 1 recorded nothing.
//
// Hand-worked figures (the tests below assert them):
//   events: 9 + 22 + 15 + 5 + 26 + 0 = 77; spans 2 + 10 + 7 + 1 + 12 = 32; instants 5 + 2 + 1 + 3 + 2 = 13.
//   load:       active 180 + 100 = 280, wait 120 + 0 = 120, tiles 2 (180 + 100: mean 140).
//   consumer 0: active 430 + 400 = 830, wait (50 + 40) + (30 + 40) = 160, tiles 3 (430 + 200 + 190: mean 820/3).
//   consumer 1: active 510, wait 20 + 280 = 300, tiles 1 (510).
//   tensor core, CTA 0: S/P·V intervals [50,90] [200,250] [210,320] [330,380] [400,440] [480,560];
//     union [50,90] [200,320] [330,380] [400,440] [480,560] = 330 busy in the window [0, 610];
//     gaps 50 110 10 20 40 50.
//   CTA 1: [1030,1080] [1110,1170] [1250,1290] [1320,1360] = 190 busy in [1000, 1400]; gaps 30 30 80 30 40.
//   busy fraction (330 + 190) / (610 + 400); gaps sorted 10 20 30 30 30 40 40 50 50 80 110:
//     median (rank 5) 40, p90 (rank 9) 80, max 110.
//   rescale: taken 3, skipped 2.
Trace synthetic() {
  using K = Kind;
  Trace t = empty_trace(2, {"load", "consumer 0", "consumer 1"}, 32);
  put(t, 0, 0, 3,
      {{0, K::tile_begin, 0},
       {0, K::tma_issue, op(Operand::q)},
       {10, K::tma_issue, op(Operand::k)},
       {20, K::tma_issue, op(Operand::v)},
       {30, K::wait_begin, w(Wait::stage_free)},
       {150, K::wait_end},
       {160, K::tma_issue, op(Operand::k)},
       {170, K::tma_issue, op(Operand::v)},
       {180, K::tile_end, 0}});
  put(t, 0, 1, 3,
      {{0, K::tile_begin, 0},
       {0, K::wait_begin, w(Wait::q)},
       {50, K::wait_end},
       {50, K::s_issue, 0},
       {90, K::s_done, 0},
       {90, K::softmax_begin, 0},
       {140, K::rescale_taken, 0},
       {150, K::softmax_end, 0},
       {160, K::wait_begin, w(Wait::kv)},
       {200, K::wait_end},
       {200, K::s_issue, 1},
       {210, K::pv_issue, 0},
       {250, K::s_done, 1},
       {250, K::softmax_begin, 1},
       {290, K::rescale_skipped, 1},
       {300, K::softmax_end, 1},
       {320, K::pv_done, 0},
       {330, K::pv_issue, 1},
       {380, K::pv_done, 1},
       {380, K::epilogue_begin, 0},
       {420, K::epilogue_end, 0},
       {430, K::tile_end, 0}});
  put(t, 0, 2, 3,
      {{100, K::tile_begin, 1},
       {100, K::wait_begin, w(Wait::q)},
       {120, K::wait_end},
       {120, K::wait_begin, w(Wait::barrier)},
       {400, K::wait_end},
       {400, K::s_issue, 0},
       {440, K::s_done, 0},
       {440, K::softmax_begin, 0},
       {470, K::rescale_taken, 0},
       {480, K::softmax_end, 0},
       {480, K::pv_issue, 0},
       {560, K::pv_done, 0},
       {560, K::epilogue_begin, 1},
       {600, K::epilogue_end, 1},
       {610, K::tile_end, 1}});
  put(t, 1, 0, 7,
      {{1000, K::tile_begin, 2},
       {1000, K::tma_issue, op(Operand::q)},
       {1010, K::tma_issue, op(Operand::k)},
       {1020, K::tma_issue, op(Operand::v)},
       {1100, K::tile_end, 2}});
  std::vector<Rec> c1;
  for (const auto& [t0, arg] : {std::pair<uint64_t, int32_t>{1000, 2}, {1210, 3}}) {
    // Tile 2 at 1000: wait 30, S 50, softmax (skipped) 30, P·V 60, epilogue 30: ends at 1200.
    // Tile 3 at 1210: wait 40, S 40, softmax (taken) 30, P·V 40, epilogue 40: ends at 1400.
    const bool first = arg == 2;
    const uint64_t wq = first ? 30 : 40, s = first ? 50 : 40, pv = first ? 60 : 40, epi = first ? 30 : 40;
    uint64_t now = t0;
    c1.push_back({now, K::tile_begin, arg});
    c1.push_back({now, K::wait_begin, w(Wait::q)});
    c1.push_back({now += wq, K::wait_end});
    c1.push_back({now, K::s_issue, 0});
    c1.push_back({now += s, K::s_done, 0});
    c1.push_back({now, K::softmax_begin, 0});
    c1.push_back({now + (first ? 20 : 10), first ? K::rescale_skipped : K::rescale_taken, 0});
    c1.push_back({now += 30, K::softmax_end, 0});
    c1.push_back({now, K::pv_issue, 0});
    c1.push_back({now += pv, K::pv_done, 0});
    c1.push_back({now, K::epilogue_begin, arg});
    c1.push_back({now += epi, K::epilogue_end, arg});
    c1.push_back({now, K::tile_end, arg});
  }
  put(t, 1, 1, 7, c1);
  return t;
}

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "fa4_trace_" + name; }

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Runs f, which must throw std::runtime_error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << parts.front() << "'";
  } catch (const std::runtime_error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n  lacks: " << p;
  }
}

size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// The value of attribute `name` of the rect whose content (its title) is at position `at`.
double attribute(const std::string& svg, size_t at, const std::string& name) {
  const size_t open = svg.rfind("<rect", at);
  const size_t a = svg.find(" " + name + "=\"", open) + name.size() + 3;
  return std::stod(svg.substr(a, svg.find('"', a) - a));
}

// Tags balance (a cheap well-formedness check: every element closed, in order).
void expect_balanced_tags(const std::string& xml) {
  std::vector<std::string> open;
  for (size_t at = xml.find('<'); at != std::string::npos; at = xml.find('<', at + 1)) {
    const size_t end = xml.find('>', at);
    ASSERT_NE(end, std::string::npos);
    const std::string tag = xml.substr(at + 1, end - at - 1);
    if (tag.front() == '?' || tag.back() == '/') continue;
    const std::string name =
        tag.substr(tag.front() == '/' ? 1 : 0, tag.find_first_of(" \n") - (tag.front() == '/' ? 1 : 0));
    if (tag.front() == '/') {
      ASSERT_FALSE(open.empty()) << "</" << name << "> closes nothing";
      ASSERT_EQ(open.back(), name) << "at offset " << at;
      open.pop_back();
    } else {
      open.push_back(name);
    }
  }
  EXPECT_TRUE(open.empty()) << open.size() << " elements left open";
}

}  // namespace

// ---- the file ----------------------------------------------------------------------------------------------

TEST(TraceFile, RoundTripIsBitExact) {
  Trace t = synthetic();
  t.events[5].pad = 0xab;  // written verbatim, pad byte included
  const std::string path = temp_path("roundtrip.fa4trace");
  write_trace(t, path);
  // magic + version + 3 strings' lengths and bytes + 3 u32 + 3 names + 6 counts + 6 × 32 events of 16 bytes
  const size_t expected_size =
      8 + 4 + (4 + t.kernel.size()) + (4 + t.shape.size()) + 12 + (4 + 4) + (4 + 10) + (4 + 10) + 6 * 4 + 6 * 32 * 16;
  EXPECT_EQ(read_bytes(path).size(), expected_size);

  const Trace r = read_trace(path);
  EXPECT_EQ(r.kernel, t.kernel);
  EXPECT_EQ(r.shape, t.shape);
  EXPECT_EQ(r.ctas, 2u);
  EXPECT_EQ(r.writers_per_cta, 3u);
  EXPECT_EQ(r.capacity, 32u);
  EXPECT_EQ(r.writer_names, t.writer_names);
  EXPECT_EQ(r.counts, t.counts);
  ASSERT_EQ(r.events.size(), t.events.size());
  EXPECT_EQ(std::memcmp(r.events.data(), t.events.data(), t.events.size() * sizeof(Event)), 0);
  EXPECT_EQ(r.events[5].pad, 0xab);
  // Written again, the bytes are the same.
  const std::string again = temp_path("roundtrip2.fa4trace");
  write_trace(r, again);
  EXPECT_EQ(read_bytes(again), read_bytes(path));
}

TEST(TraceFile, RejectsTruncatedFile) {
  const std::string path = temp_path("full.fa4trace"), cut = temp_path("cut.fa4trace");
  write_trace(synthetic(), path);
  const std::string bytes = read_bytes(path);
  write_bytes(cut, bytes.substr(0, bytes.size() - 10));  // inside the last slice
  expect_error([&] { read_trace(cut); }, {cut, "truncated", "the events"});
  write_bytes(cut, bytes.substr(0, 20));  // inside the kernel name
  expect_error([&] { read_trace(cut); }, {cut, "truncated", "the kernel name"});
  write_bytes(cut, bytes.substr(0, 5));
  expect_error([&] { read_trace(cut); }, {cut, "truncated", "magic"});
}

TEST(TraceFile, RejectsWrongMagic) {
  const std::string path = temp_path("magic.fa4trace");
  write_trace(synthetic(), path);
  std::string bytes = read_bytes(path);
  bytes[3] = 'X';
  write_bytes(path, bytes);
  expect_error([&] { read_trace(path); }, {path, "bad magic"});
}

TEST(TraceFile, RejectsWrongVersion) {
  const std::string path = temp_path("version.fa4trace");
  write_trace(synthetic(), path);
  std::string bytes = read_bytes(path);
  bytes[8] = 2;  // the version, little-endian, right after the magic
  write_bytes(path, bytes);
  expect_error([&] { read_trace(path); }, {path, "unsupported version 2"});
}

TEST(TraceFile, RejectsSizesThatDoNotMatch) {
  const std::string path = temp_path("sizes.fa4trace");
  write_trace(synthetic(), path);
  write_bytes(path, read_bytes(path) + std::string(16, '\0'));  // one event more than the header says
  expect_error([&] { read_trace(path); }, {path, "sizes do not match", "16 bytes after"});

  Trace bad = synthetic();
  bad.counts.pop_back();
  expect_error([&] { write_trace(bad, path); }, {path, "5 counts for 2 CTAs × 3 writers"});
  expect_error([&] { read_trace(temp_path("does-not-exist")); }, {"does-not-exist", "cannot open"});
}

// ---- validate and slices -----------------------------------------------------------------------------------

TEST(TraceValidate, AcceptsInterleavedTensorCoreSpans) {
  const Trace t = synthetic();
  EXPECT_NO_THROW(validate(t));
  // S(1) = [200, 250] and P·V(0) = [210, 320] overlap without nesting: both matched, oldest first.
  const auto spans = match_spans(t.slice(0, 1));
  EXPECT_EQ(spans.size(), 10u);
  std::vector<std::tuple<Kind, uint32_t, uint32_t>> async;
  for (const Span& s : spans)
    if (is_async_span(s.kind)) async.emplace_back(s.kind, s.begin, s.end);
  const std::vector<std::tuple<Kind, uint32_t, uint32_t>> expected = {
      {Kind::s_issue, 3, 4}, {Kind::s_issue, 10, 12}, {Kind::pv_issue, 11, 16}, {Kind::pv_issue, 17, 18}};
  EXPECT_EQ(async, expected);
}

TEST(TraceValidate, RejectsUnmatchedEnd) {
  Trace t = synthetic();
  t.events[(1 * 3 + 0) * 32 + 0].kind = uint8_t(Kind::tma_issue);  // CTA 1's load loses its tile_begin
  expect_error([&] { validate(t); }, {"CTA 1 · load", "event 4 tile_end without its tile_begin"});

  t = synthetic();
  t.events[(0 * 3 + 1) * 32 + 3].kind = uint8_t(Kind::tma_issue);  // CTA 0's consumer 0 loses its first s_issue
  expect_error([&] { validate(t); }, {"CTA 0 · consumer 0", "event 4 s_done without its s_issue"});
}

TEST(TraceValidate, RejectsImproperNesting) {
  Trace t = synthetic();
  Event* ev = &t.events[(0 * 3 + 1) * 32];  // CTA 0's consumer 0: epilogue_begin 380, tile_end 420, epilogue_end 430
  ev[20].kind = uint8_t(Kind::tile_end);
  ev[21].kind = uint8_t(Kind::epilogue_end);
  expect_error([&] { validate(t); },
               {"CTA 0 · consumer 0", "improperly nested", "event 20 tile_end", "epilogue_begin of event 19"});
}

TEST(TraceValidate, RejectsDecreasingTimestamps) {
  Trace t = synthetic();
  t.events[(0 * 3 + 2) * 32 + 5].t_ns = kBase + 390;  // CTA 0's consumer 1: s_issue before the wait_end at 400
  expect_error([&] { validate(t); }, {"CTA 0 · consumer 1", "timestamps decreasing: event 5"});
}

TEST(TraceValidate, RejectsBadKindAndSizes) {
  Trace t = synthetic();
  t.events[(1 * 3 + 1) * 32 + 7].kind = uint8_t(Kind::kind_count);
  expect_error([&] { validate(t); }, {"CTA 1 · consumer 0", "event 7 has kind 17 (kinds end at 17)"});

  t = synthetic();
  t.writer_names.pop_back();
  expect_error([&] { validate(t); }, {"2 writer names for 3 writers per CTA"});
  t = synthetic();
  t.events.pop_back();
  expect_error([&] { validate(t); }, {"191 events for 2 CTAs × 3 writers × capacity 32"});
  t = empty_trace(1, std::vector<std::string>(9, "w"), 4);
  expect_error([&] { validate(t); }, {"9 writers per CTA (at most 8)"});
}

TEST(TraceSlices, DroppedEventsOfAnOverflowedSlice) {
  Trace t = empty_trace(1, {"load", "consumer 0"}, 4);
  put(t, 0, 0, 1, {{0, Kind::tile_begin}, {5, Kind::wait_begin}, {9, Kind::wait_end}, {12, Kind::tma_issue}});
  put(t, 0, 1, 1, {{2, Kind::tile_begin}, {8, Kind::tile_end}});
  t.counts[0] = 7;  // the writer asked for 7: the last 3 (including its tile_end) were dropped
  EXPECT_EQ(t.dropped(), 3u);
  EXPECT_EQ(t.recorded(0, 0), 4u);
  EXPECT_EQ(t.slice(0, 0).size(), 4u);
  EXPECT_EQ(t.recorded(0, 1), 2u);
  EXPECT_EQ(t.slice(0, 1).back().t_ns, kBase + 8);
  EXPECT_NO_THROW(validate(t));  // the open tile is the overflow's doing, not a malformed trace
  EXPECT_THROW(t.slice(1, 0), std::out_of_range);

  const auto j = perfetto_json(t);
  EXPECT_EQ(j["otherData"]["dropped"], 3);
  EXPECT_EQ(j["otherData"]["events"], 6);
  size_t x = 0;
  for (const auto& e : j["traceEvents"]) x += e["ph"] == "X";
  EXPECT_EQ(x, 2u);  // the wait and consumer 0's tile; the load's open tile is left out

  const Summary s = summarize(t);
  EXPECT_EQ(s.dropped, 3u);
  EXPECT_EQ(s.events, 6u);
  EXPECT_NE(to_text(s).find("WARNING: 3 events were dropped"), std::string::npos) << to_text(s);
}

// ---- Perfetto ----------------------------------------------------------------------------------------------

TEST(TracePerfetto, CompleteEventsInstantsAndTracks) {
  const auto j = perfetto_json(synthetic());
  // It is JSON Perfetto reads: the dump parses back.
  EXPECT_EQ(nlohmann::json::parse(j.dump()), j);
  EXPECT_EQ(j["displayTimeUnit"], "ns");
  EXPECT_EQ(j["otherData"]["kernel"], "sm90 fwd bf16 d128 <test>");
  EXPECT_EQ(j["otherData"]["events"], 77);
  EXPECT_EQ(j["otherData"]["dropped"], 0);
  EXPECT_EQ(j["otherData"]["t0_ns"].get<uint64_t>(), kBase);

  std::map<std::string, int> x_by_name, i_by_name;
  std::set<std::tuple<int, int, std::string>> threads;
  std::map<int, std::string> processes;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"].get<std::string>(), name = e["name"].get<std::string>();
    if (ph == "X") {
      ++x_by_name[name];
      // The tensor-core tracks carry only their own spans.
      const int lane = e["tid"].get<int>() % 4;
      const std::string expected_on_lane = lane == 1 ? "S=QK^T" : lane == 2 ? "P·V" : "";
      if (lane != 0) {
        EXPECT_EQ(name, expected_on_lane);
      } else {
        EXPECT_TRUE(name != "S=QK^T" && name != "P·V") << name;
      }
    } else if (ph == "i") {
      EXPECT_EQ(e["s"], "t");
      ++i_by_name[name];
    } else if (ph == "M" && name == "thread_name") {
      threads.emplace(e["pid"].get<int>(), e["tid"].get<int>(), e["args"]["name"].get<std::string>());
    } else if (ph == "M" && name == "process_name") {
      processes[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
    }
  }
  // One X per span: 32, by name.
  const std::map<std::string, int> x_expected = {
      {"tile", 6},   {"wait q", 4},  {"wait kv", 1}, {"wait barrier", 1}, {"wait stage_free", 1},
      {"S=QK^T", 5}, {"softmax", 5}, {"P·V", 5},     {"epilogue", 4}};
  EXPECT_EQ(x_by_name, x_expected);
  const std::map<std::string, int> i_expected = {
      {"tma q", 2}, {"tma k", 3}, {"tma v", 3}, {"rescale taken", 3}, {"rescale skipped", 2}};
  EXPECT_EQ(i_by_name, i_expected);

  // tid = (cta·3 + writer)·4 (+1 S, +2 P·V); pid = the SM. CTA 1's consumer 1 recorded nothing: no track.
  const std::set<std::tuple<int, int, std::string>> threads_expected = {{3, 0, "CTA 0 · load"},
                                                                        {3, 4, "CTA 0 · consumer 0"},
                                                                        {3, 5, "CTA 0 · consumer 0 · S=QK^T"},
                                                                        {3, 6, "CTA 0 · consumer 0 · P·V"},
                                                                        {3, 8, "CTA 0 · consumer 1"},
                                                                        {3, 9, "CTA 0 · consumer 1 · S=QK^T"},
                                                                        {3, 10, "CTA 0 · consumer 1 · P·V"},
                                                                        {7, 12, "CTA 1 · load"},
                                                                        {7, 16, "CTA 1 · consumer 0"},
                                                                        {7, 17, "CTA 1 · consumer 0 · S=QK^T"},
                                                                        {7, 18, "CTA 1 · consumer 0 · P·V"}};
  EXPECT_EQ(threads, threads_expected);
  EXPECT_EQ(processes, (std::map<int, std::string>{{3, "SM 3"}, {7, "SM 7"}}));

  // Timing: µs since kBase, ns kept as fractions.
  auto find = [&](const std::string& ph, const std::string& name, int pid, int tid, double ts) -> nlohmann::json {
    for (const auto& e : j["traceEvents"])
      if (e["ph"] == ph && e["name"] == name && e["pid"] == pid && e["tid"] == tid && e["ts"].get<double>() == ts)
        return e;
    ADD_FAILURE() << "no " << ph << " '" << name << "' on pid " << pid << " tid " << tid << " at " << ts;
    return nlohmann::json::object();
  };
  EXPECT_DOUBLE_EQ(find("X", "P·V", 3, 6, 0.21).value("dur", -1.0), 0.11);    // [210, 320]
  EXPECT_DOUBLE_EQ(find("X", "P·V", 3, 6, 0.33).value("dur", -1.0), 0.05);    // [330, 380]
  EXPECT_DOUBLE_EQ(find("X", "S=QK^T", 3, 5, 0.2).value("dur", -1.0), 0.05);  // [200, 250]
  EXPECT_DOUBLE_EQ(find("X", "wait stage_free", 3, 0, 0.03).value("dur", -1.0), 0.12);
  EXPECT_DOUBLE_EQ(find("X", "wait barrier", 3, 8, 0.12).value("dur", -1.0), 0.28);
  const auto tile3 = find("X", "tile", 7, 16, 1.21);
  EXPECT_DOUBLE_EQ(tile3.value("dur", -1.0), 0.19);
  EXPECT_EQ(tile3["args"]["arg"], 3);
  EXPECT_EQ(find("X", "P·V", 3, 6, 0.33)["args"]["arg"], 1);
  EXPECT_EQ(find("i", "rescale taken", 3, 8, 0.47)["args"]["arg"], 0);
  EXPECT_EQ(find("i", "tma k", 7, 12, 1.01)["args"]["arg"], int(Operand::k));
}

// ---- SVG ---------------------------------------------------------------------------------------------------

TEST(TraceSvg, LanesLifetimesAndEscaping) {
  const Trace t = synthetic();
  const std::string svg = timeline_svg(t, {0, 1});
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  expect_balanced_tags(svg);
  EXPECT_EQ(svg.find("<test>"), std::string::npos);
  EXPECT_NE(svg.find("sm90 fwd bf16 d128 &lt;test&gt;"), std::string::npos);
  EXPECT_NE(svg.find("causal &amp; &quot;quoted&quot;"), std::string::npos);

  EXPECT_EQ(occurrences(svg, "<g class=\"lane\""), 6u);  // one per (cta, writer), the empty one included
  EXPECT_NE(svg.find("CTA 1 · consumer 1<"), std::string::npos);
  EXPECT_NE(svg.find("CTA 0 · consumer 0 (SM 3)"), std::string::npos);
  EXPECT_EQ(occurrences(svg, "<rect class=\"span\""), 32u);
  EXPECT_EQ(occurrences(svg, "<line class=\"instant\""), 13u);
  // Three lifetime lanes for each writer with S = QKᵀ: CTA 0's two consumers, CTA 1's consumer 0.
  EXPECT_EQ(occurrences(svg, "<g class=\"lifetime\""), 9u);
  EXPECT_EQ(occurrences(svg, "class=\"life-S\""), 5u);
  EXPECT_EQ(occurrences(svg, "class=\"life-P\""), 5u);
  EXPECT_EQ(occurrences(svg, "class=\"life-O\""), 4u);
  // The pairing: S(1) consumed by the softmax ending at 300; P(0) from its softmax_end at 150 to the P·V done at
  // 320, after S(1)'s softmax; O of each work tile from tile_begin to epilogue_end.
  EXPECT_NE(svg.find("S of tile 1: 200–300 ns, 100 ns"), std::string::npos);
  EXPECT_NE(svg.find("P of tile 0: 150–320 ns, 170 ns"), std::string::npos);
  EXPECT_NE(svg.find("P of tile 1: 300–380 ns, 80 ns"), std::string::npos);
  EXPECT_NE(svg.find("O of tile 1: 100–600 ns, 500 ns"), std::string::npos);
  EXPECT_NE(svg.find("O of tile 3: 1210–1400 ns, 190 ns"), std::string::npos);

  const std::string one = timeline_svg(t, {0});
  expect_balanced_tags(one);
  EXPECT_EQ(occurrences(one, "<g class=\"lane\""), 3u);
  EXPECT_EQ(occurrences(one, "<g class=\"lifetime\""), 6u);
  EXPECT_EQ(occurrences(one, "class=\"life-S\""), 3u);
  EXPECT_EQ(occurrences(one, "class=\"life-P\""), 3u);
  EXPECT_EQ(occurrences(one, "class=\"life-O\""), 2u);
  // x scale: CTA 0 alone spans 610 ns over the 1000 px plot that starts at x = 230.
  const size_t o0 = one.find("O of tile 0: 0–420 ns");
  ASSERT_NE(o0, std::string::npos);
  EXPECT_NEAR(attribute(one, o0, "x"), 230.0, 0.01);
  EXPECT_NEAR(attribute(one, o0, "width"), 420.0 * 1000.0 / 610.0, 0.01);

  EXPECT_THROW(timeline_svg(t, {2}), std::out_of_range);
}

// The backward's consumer: S and P per query tile, one O (the dK/dV accumulators) from its first tile_begin to
// the epilogue after its last tile.
TEST(TraceSvg, BackwardAccumulatorLifetime) {
  using K = Kind;
  Trace t = empty_trace(1, {"load", "dq writer", "consumer 0"}, 32);
  put(t, 0, 2, 5,
      {{0, K::tile_begin, 0},
       {0, K::s_issue, 0},
       {10, K::s_done, 0},
       {10, K::softmax_begin, 0},
       {20, K::softmax_end, 0},
       {20, K::pv_issue, 0},
       {40, K::pv_done, 0},
       {40, K::tile_end, 0},
       {50, K::tile_begin, 1},
       {50, K::s_issue, 1},
       {60, K::s_done, 1},
       {60, K::softmax_begin, 1},
       {70, K::softmax_end, 1},
       {70, K::pv_issue, 1},
       {90, K::pv_done, 1},
       {90, K::tile_end, 1},
       {100, K::epilogue_begin, 5},
       {130, K::epilogue_end, 5}});
  ASSERT_NO_THROW(validate(t));
  const std::string svg = timeline_svg(t, {0});
  expect_balanced_tags(svg);
  EXPECT_EQ(occurrences(svg, "<g class=\"lane\""), 3u);
  EXPECT_EQ(occurrences(svg, "<g class=\"lifetime\""), 3u);
  EXPECT_EQ(occurrences(svg, "class=\"life-S\""), 2u);
  EXPECT_EQ(occurrences(svg, "class=\"life-P\""), 2u);
  EXPECT_EQ(occurrences(svg, "class=\"life-O\""), 1u);
  EXPECT_NE(svg.find("S of tile 1: 50–70 ns, 20 ns"), std::string::npos);
  EXPECT_NE(svg.find("P of tile 0: 20–40 ns, 20 ns"), std::string::npos);
  EXPECT_NE(svg.find("O of tile 0: 0–130 ns, 130 ns"), std::string::npos);
}

// ---- summary -----------------------------------------------------------------------------------------------

TEST(TraceSummary, HandComputedFigures) {
  const Summary s = summarize(synthetic());
  EXPECT_EQ(s.kernel, "sm90 fwd bf16 d128 <test>");
  EXPECT_EQ(s.ctas, 2u);
  EXPECT_EQ(s.events, 77u);
  EXPECT_EQ(s.dropped, 0u);
  EXPECT_DOUBLE_EQ(s.elapsed_ns, 1400.0);

  ASSERT_EQ(s.writers.size(), 3u);
  EXPECT_EQ(s.writers[0].writer, "load");
  EXPECT_DOUBLE_EQ(s.writers[0].active_ns, 280.0);
  EXPECT_DOUBLE_EQ(s.writers[0].wait_ns, 120.0);
  EXPECT_DOUBLE_EQ(s.writers[0].busy_fraction, 160.0 / 280.0);
  EXPECT_EQ(s.writers[0].tiles, 2u);
  EXPECT_DOUBLE_EQ(s.writers[0].mean_tile_ns, 140.0);

  EXPECT_EQ(s.writers[1].writer, "consumer 0");
  EXPECT_DOUBLE_EQ(s.writers[1].active_ns, 830.0);
  EXPECT_DOUBLE_EQ(s.writers[1].wait_ns, 160.0);
  EXPECT_DOUBLE_EQ(s.writers[1].busy_fraction, 670.0 / 830.0);
  EXPECT_EQ(s.writers[1].tiles, 3u);
  EXPECT_DOUBLE_EQ(s.writers[1].mean_tile_ns, 820.0 / 3.0);

  EXPECT_EQ(s.writers[2].writer, "consumer 1");
  EXPECT_DOUBLE_EQ(s.writers[2].active_ns, 510.0);
  EXPECT_DOUBLE_EQ(s.writers[2].wait_ns, 300.0);
  EXPECT_DOUBLE_EQ(s.writers[2].busy_fraction, 210.0 / 510.0);
  EXPECT_EQ(s.writers[2].tiles, 1u);
  EXPECT_DOUBLE_EQ(s.writers[2].mean_tile_ns, 510.0);

  EXPECT_DOUBLE_EQ(s.tensor_busy_fraction, 520.0 / 1010.0);
  EXPECT_DOUBLE_EQ(s.tensor_idle_gap_median_ns, 40.0);
  EXPECT_DOUBLE_EQ(s.tensor_idle_gap_p90_ns, 80.0);
  EXPECT_DOUBLE_EQ(s.tensor_idle_gap_max_ns, 110.0);

  EXPECT_EQ(s.rescale_taken, 3u);
  EXPECT_EQ(s.rescale_skipped, 2u);
  EXPECT_DOUBLE_EQ(s.rescale_taken_fraction, 0.6);

  const auto j = to_json(s);
  EXPECT_EQ(j["writers"][1]["tiles"], 3);
  EXPECT_DOUBLE_EQ(j["tensor_busy_fraction"].get<double>(), 520.0 / 1010.0);
  EXPECT_EQ(j["rescale_taken"], 3);
  EXPECT_EQ(j["events"], 77);

  const std::string text = to_text(s);
  EXPECT_NE(text.find("consumer 1"), std::string::npos) << text;
  EXPECT_NE(text.find("busy 51.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("median 40 ns, p90 80 ns, max 110 ns"), std::string::npos) << text;
  EXPECT_NE(text.find("taken 3, skipped 2 (60.0% taken)"), std::string::npos) << text;
  EXPECT_EQ(text.find("WARNING"), std::string::npos) << text;
}

// Per-row rescales: each taken decision is followed by how many of the recording warp's 16 rows moved their
// max; the summary reports them over 16 rows per decision, and says nothing per row for traces without them.
TEST(TraceSummary, RescaleRowsPerDecision) {
  using K = Kind;
  Trace t = empty_trace(1, {"consumer 0"}, 32);
  put(t, 0, 0, 0,
      {{0, K::tile_begin},
       {10, K::rescale_taken, 1},
       {10, K::rescale_rows, 3},
       {20, K::rescale_skipped, 2},
       {30, K::rescale_taken, 3},
       {30, K::rescale_rows, 16},
       {40, K::rescale_skipped, 4},
       {50, K::tile_end}});
  const Summary s = summarize(t);
  EXPECT_EQ(s.rescale_taken, 2u);
  EXPECT_EQ(s.rescale_skipped, 2u);
  EXPECT_EQ(s.rescale_rows, 19u);
  EXPECT_EQ(s.rescale_row_samples, 2u);
  EXPECT_DOUBLE_EQ(s.rescale_row_fraction, 19.0 / 64.0);
  const std::string text = to_text(s);
  EXPECT_NE(text.find("rescale rows 19 of 64 row decisions moved their max (29.69%; 9.5 of 16 rows per taken tile"),
            std::string::npos)
      << text;
  EXPECT_EQ(to_json(s)["rescale_rows"], 19);

  Trace old = empty_trace(1, {"consumer 0"}, 8);  // recorded before rescale_rows existed
  put(old, 0, 0, 0, {{0, K::tile_begin}, {10, K::rescale_taken, 1}, {20, K::tile_end}});
  EXPECT_EQ(to_text(summarize(old)).find("rescale rows"), std::string::npos);
}

// Overlapping tensor-core intervals merge, intervals past the window are clipped to it, and the percentiles
// interpolate between ranks.
TEST(TraceSummary, TensorCoreUnionClipsAndInterpolates) {
  using K = Kind;
  Trace t = empty_trace(1, {"consumer 0", "consumer 1"}, 16);
  // Window [0, 100] (tile_begin .. tile_end). Intervals S [10,20], P·V [15,25], P·V [30,60], S [65,70] and the
  // other writer's S [90,120], clipped to [90,100]. Union [10,25] [30,60] [65,70] [90,100] = 60 busy.
  // Gaps 10 (0..10), 5 (25..30), 5 (60..65), 20 (70..90): sorted 5 5 10 20, median 7.5, p90 at rank 2.7: 17.
  put(t, 0, 0, 0,
      {{0, K::tile_begin},
       {10, K::s_issue},
       {15, K::pv_issue},
       {20, K::s_done},
       {25, K::pv_done},
       {30, K::pv_issue},
       {60, K::pv_done},
       {65, K::s_issue},
       {70, K::s_done},
       {100, K::tile_end}});
  put(t, 0, 1, 0, {{90, K::s_issue}, {120, K::s_done}});
  ASSERT_NO_THROW(validate(t));
  const Summary s = summarize(t);
  EXPECT_DOUBLE_EQ(s.tensor_busy_fraction, 0.6);
  EXPECT_DOUBLE_EQ(s.tensor_idle_gap_median_ns, 7.5);
  EXPECT_DOUBLE_EQ(s.tensor_idle_gap_p90_ns, 17.0);
  EXPECT_DOUBLE_EQ(s.tensor_idle_gap_max_ns, 20.0);
  EXPECT_DOUBLE_EQ(s.elapsed_ns, 120.0);
  EXPECT_DOUBLE_EQ(s.writers[0].busy_fraction, 1.0);  // no waits
  EXPECT_DOUBLE_EQ(s.writers[1].active_ns, 30.0);
  EXPECT_EQ(s.writers[1].tiles, 0u);
  EXPECT_DOUBLE_EQ(s.writers[1].mean_tile_ns, 0.0);
}
