// Perfetto JSON, the SVG timeline and the summary of a kernel trace (export.hpp).
#include "trace/export.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <iterator>
#include <limits>
#include <set>
#include <stdexcept>
#include <string_view>

namespace fa4::trace {

namespace {

using json = nlohmann::json;

constexpr std::array<std::string_view, 10> kWaitNames = {"q",          "kv",      "k",         "v",       "tile_slot",
                                                         "stage_free", "dq_turn", "dq_buffer", "barrier", "peer"};
constexpr std::array<std::string_view, 7> kOperandNames = {"q", "k", "v", "dout", "lse", "dsum", "out"};

template <size_t N>
std::string name_in(const std::array<std::string_view, N>& names, int32_t arg) {
  return arg >= 0 && size_t(arg) < N ? std::string(names[size_t(arg)]) : std::to_string(arg);
}

constexpr bool is_end(Kind k) {
  for (uint8_t b = 0; b < uint8_t(Kind::kind_count); ++b)
    if (span_end_of(Kind(b)) == k) return true;
  return false;
}
constexpr bool is_instant(Kind k) { return k < Kind::kind_count && span_end_of(k) == Kind::kind_count && !is_end(k); }

// b − a, never wrapping (a malformed trace may have decreasing timestamps; validate() reports those).
uint64_t since(uint64_t a, uint64_t b) { return b > a ? b - a : 0; }

// Earliest and latest timestamp of a set of slices.
struct TimeRange {
  uint64_t lo = std::numeric_limits<uint64_t>::max(), hi = 0;
  void add(uint64_t t) { lo = std::min(lo, t), hi = std::max(hi, t); }
  bool empty() const { return lo > hi; }
};

TimeRange range_of(const Trace& t, const std::vector<uint32_t>& ctas) {
  TimeRange r;
  for (uint32_t c : ctas)
    for (uint32_t w = 0; w < t.writers_per_cta; ++w)
      for (const Event& e : t.slice(c, w)) r.add(e.t_ns);
  return r;
}

std::vector<uint32_t> all_ctas(const Trace& t) {
  std::vector<uint32_t> v(t.ctas);
  for (uint32_t c = 0; c < t.ctas; ++c) v[c] = c;
  return v;
}

// Which of a writer's tracks a span goes on (Perfetto) and which strip of its lane it is drawn in (SVG).
enum Track : uint32_t { kOwnTrack = 0, kSTrack = 1, kPvTrack = 2, kTracksPerWriter = 4 };
Track track_of(Kind begin) { return begin == Kind::s_issue ? kSTrack : begin == Kind::pv_issue ? kPvTrack : kOwnTrack; }

}  // namespace

std::string display_name(const Event& e) {
  switch (Kind(e.kind)) {
    case Kind::tile_begin:
    case Kind::tile_end:
      return "tile";
    case Kind::wait_begin:
      return "wait " + name_in(kWaitNames, e.arg);
    case Kind::wait_end:
      return "wait";
    case Kind::tma_issue:
      return "tma " + name_in(kOperandNames, e.arg);
    case Kind::s_issue:
    case Kind::s_done:
      return "S=QK^T";
    case Kind::softmax_begin:
    case Kind::softmax_end:
      return "softmax";
    case Kind::rescale_taken:
      return "rescale taken";
    case Kind::rescale_skipped:
      return "rescale skipped";
    case Kind::pv_issue:
    case Kind::pv_done:
      return "P·V";
    case Kind::epilogue_begin:
    case Kind::epilogue_end:
      return "epilogue";
    case Kind::dq_add:
      return "dq add";
    case Kind::rescale_rows:
      return fmt::format("rescale rows {}", e.arg);
    default:
      return fmt::format("kind {}", e.kind);
  }
}

// ---- Perfetto ----------------------------------------------------------------------------------------------

json perfetto_json(const Trace& t) {
  const TimeRange range = range_of(t, all_ctas(t));
  const uint64_t t0 = range.empty() ? 0 : range.lo;
  auto us = [&](uint64_t ns) { return double(since(t0, ns)) / 1000.0; };

  json meta = json::array(), events = json::array();
  std::set<uint32_t> sms;  // the SMs seen, for their process names
  for (uint32_t c = 0; c < t.ctas; ++c)
    for (uint32_t w = 0; w < t.writers_per_cta; ++w) {
      const auto ev = t.slice(c, w);
      if (ev.empty()) continue;
      // A CTA runs on one SM: the slice's first event says which, and keeps (pid, tid) stable for the slice.
      const uint32_t pid = ev.front().sm;
      const uint32_t tid = (c * t.writers_per_cta + w) * kTracksPerWriter;
      sms.insert(pid);
      std::array<bool, kTracksPerWriter> used{};

      std::vector<Span> spans = match_spans(ev);
      std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
      for (const Span& s : spans) {
        const Event &b = ev[s.begin], &e = ev[s.end];
        const Track track = track_of(s.kind);
        used[track] = true;
        events.push_back({{"name", display_name(b)},
                          {"ph", "X"},
                          {"pid", pid},
                          {"tid", tid + track},
                          {"ts", us(b.t_ns)},
                          {"dur", double(since(b.t_ns, e.t_ns)) / 1000.0},
                          {"args", {{"arg", b.arg}}}});
      }
      for (const Event& e : ev)
        if (is_instant(Kind(e.kind))) {
          used[kOwnTrack] = true;
          events.push_back({{"name", display_name(e)},
                            {"ph", "i"},
                            {"s", "t"},
                            {"pid", pid},
                            {"tid", tid},
                            {"ts", us(e.t_ns)},
                            {"args", {{"arg", e.arg}}}});
        }

      const std::string base = fmt::format("CTA {} · {}", c, t.writer_names[w]);
      const std::array<std::string, 3> names = {base, base + " · S=QK^T", base + " · P·V"};
      for (uint32_t k = 0; k < names.size(); ++k) {
        if (!used[k]) continue;
        meta.push_back(
            {{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid + k}, {"args", {{"name", names[k]}}}});
        // Tracks in CTA, writer order (Perfetto would otherwise sort them by name).
        meta.push_back({{"name", "thread_sort_index"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", tid + k},
                        {"args", {{"sort_index", tid + k}}}});
      }
    }
  for (const uint32_t sm : sms) {
    meta.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", sm},
                    {"tid", 0},
                    {"args", {{"name", fmt::format("SM {}", sm)}}}});
    meta.push_back(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", sm}, {"tid", 0}, {"args", {{"sort_index", sm}}}});
  }
  for (auto& e : events) meta.push_back(std::move(e));

  uint64_t recorded = 0;
  for (uint32_t c = 0; c < t.ctas; ++c)
    for (uint32_t w = 0; w < t.writers_per_cta; ++w) recorded += t.recorded(c, w);
  return {{"displayTimeUnit", "ns"},
          {"traceEvents", std::move(meta)},
          {"otherData",
           {{"kernel", t.kernel},
            {"shape", t.shape},
            {"ctas", t.ctas},
            {"writers_per_cta", t.writers_per_cta},
            {"capacity", t.capacity},
            {"writer_names", t.writer_names},
            {"events", recorded},
            {"dropped", t.dropped()},
            {"t0_ns", t0}}}};
}

// ---- SVG timeline ------------------------------------------------------------------------------------------

namespace {

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += ch;
    }
  return out;
}

std::string_view colour_of(Kind k) {
  switch (k) {
    case Kind::tile_begin:
      return "#d0d0d0";
    case Kind::wait_begin:
      return "#f4a582";
    case Kind::s_issue:
      return "#2166ac";
    case Kind::softmax_begin:
      return "#5aae61";
    case Kind::pv_issue:
      return "#762a83";
    case Kind::epilogue_begin:
      return "#fdb863";
    case Kind::rescale_taken:
      return "#d6604d";
    case Kind::rescale_skipped:
      return "#67a9cf";
    case Kind::tma_issue:
      return "#35978f";
    case Kind::dq_add:
      return "#b2182b";
    default:
      return "#888888";
  }
}

// The three tile lifetimes of a consumer writer (export.hpp: S, P, O), each a list of [from, to] intervals.
struct Lifetime {
  uint64_t from, to;
  int32_t arg;  // the kv tile (S, P) or the work tile (O)
};
struct Lifetimes {
  std::vector<Lifetime> s, p, o;
};

Lifetimes lifetimes_of(std::span<const Event> ev) {
  Lifetimes l;
  // Paired oldest first: an S is consumed by the next softmax, a P by the next P·V that completes.
  std::deque<std::pair<uint64_t, int32_t>> s_open, p_open;
  const Event* o_open = nullptr;
  for (const Event& e : ev) switch (Kind(e.kind)) {
      case Kind::s_issue:
        s_open.emplace_back(e.t_ns, e.arg);
        break;
      case Kind::softmax_end: {
        int32_t arg = e.arg;
        if (!s_open.empty()) {
          arg = s_open.front().second;
          l.s.push_back({s_open.front().first, e.t_ns, arg});
          s_open.pop_front();
        }
        p_open.emplace_back(e.t_ns, arg);
        break;
      }
      case Kind::pv_done:
        if (!p_open.empty()) {
          l.p.push_back({p_open.front().first, e.t_ns, p_open.front().second});
          p_open.pop_front();
        }
        break;
      // O lives from the first tile_begin after the previous epilogue to the next epilogue_end: per work tile in
      // the forward; in the backward the dK/dV accumulators stay across a key block's query tiles.
      case Kind::tile_begin:
        if (o_open == nullptr) o_open = &e;
        break;
      case Kind::epilogue_end:
        if (o_open != nullptr) l.o.push_back({o_open->t_ns, e.t_ns, o_open->arg});
        o_open = nullptr;
        break;
      default:
        break;
    }
  return l;
}

bool has_s_issue(std::span<const Event> ev) {
  return std::any_of(ev.begin(), ev.end(), [](const Event& e) { return Kind(e.kind) == Kind::s_issue; });
}

// A tick step of 1, 2 or 5 × 10^k ns giving about `target` ticks over span_ns, and its label.
double tick_step(double span_ns, double target) {
  const double raw = span_ns / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= raw) return m * p;
  return 10.0 * p;
}
std::string time_label(double ns, double step) {
  if (step >= 1e6) return fmt::format("{:g} ms", ns / 1e6);
  if (step >= 1e3) return fmt::format("{:g} µs", ns / 1e3);
  return fmt::format("{:g} ns", ns);
}

// Layout, in px.
constexpr double kLeft = 230, kPlotW = 1000, kRight = 30, kWidth = kLeft + kPlotW + kRight;
constexpr double kTitleH = 44, kAxisH = 26, kLaneH = 18, kLaneGap = 4, kLifeH = 6, kLifeGap = 3, kCtaGap = 10;
constexpr double kBarH = 5;  // tensor-core spans: a bar along the lane's bottom edge

}  // namespace

std::string timeline_svg(const Trace& t, const std::vector<uint32_t>& ctas) {
  for (uint32_t c : ctas)
    if (c >= t.ctas) throw std::out_of_range(fmt::format("timeline_svg: CTA {} (the trace has {})", c, t.ctas));
  const TimeRange range = range_of(t, ctas);
  const uint64_t t_lo = range.empty() ? 0 : range.lo;
  const double span_ns = range.empty() ? 1.0 : double(std::max<uint64_t>(1, range.hi - range.lo));
  auto x = [&](uint64_t ns) { return kLeft + double(since(t_lo, ns)) * kPlotW / span_ns; };
  auto width = [&](uint64_t a, uint64_t b) { return std::max(0.5, double(since(a, b)) * kPlotW / span_ns); };
  auto rel = [&](uint64_t ns) { return since(t_lo, ns); };

  std::string body;
  auto out = std::back_inserter(body);
  const double lanes_top = kTitleH + kAxisH;
  double y = lanes_top;
  for (uint32_t c : ctas) {
    for (uint32_t w = 0; w < t.writers_per_cta; ++w) {
      const auto ev = t.slice(c, w);
      const std::string label = ev.empty() ? fmt::format("CTA {} · {}", c, t.writer_names[w])
                                           : fmt::format("CTA {} · {} (SM {})", c, t.writer_names[w], ev.front().sm);
      fmt::format_to(out, "<g class=\"lane\" data-cta=\"{}\" data-writer=\"{}\">\n", c, w);
      fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" class=\"label\">{}</text>\n", kLeft - 8,
                     y + kLaneH - 5, xml_escape(label));
      fmt::format_to(out, "<rect class=\"lane-bg\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\"/>\n",
                     kLeft, y, kPlotW, kLaneH);

      std::vector<Span> spans = match_spans(ev);
      std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
      // The writer's own spans nest (validate()); each is inset by its depth so the inner ones show on top.
      std::vector<uint32_t> enclosing_ends;
      for (const Span& s : spans) {
        if (is_async_span(s.kind)) continue;
        while (!enclosing_ends.empty() && enclosing_ends.back() < s.begin) enclosing_ends.pop_back();
        const double depth = double(enclosing_ends.size());
        enclosing_ends.push_back(s.end);
        const Event &b = ev[s.begin], &e = ev[s.end];
        const double inset = std::min(depth * 3.0, kLaneH / 2 - 2);
        fmt::format_to(out,
                       "<rect class=\"span\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\">"
                       "<title>{} (arg {}): {}–{} ns, {} ns</title></rect>\n",
                       x(b.t_ns), y + inset, width(b.t_ns, e.t_ns), kLaneH - 2 * inset, colour_of(s.kind),
                       xml_escape(display_name(b)), b.arg, rel(b.t_ns), rel(e.t_ns), since(b.t_ns, e.t_ns));
      }
      for (const Span& s : spans) {
        if (!is_async_span(s.kind)) continue;
        const Event &b = ev[s.begin], &e = ev[s.end];
        fmt::format_to(out,
                       "<rect class=\"span\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\" "
                       "fill-opacity=\"0.75\"><title>{} (arg {}): {}–{} ns, {} ns</title></rect>\n",
                       x(b.t_ns), y + kLaneH - kBarH, width(b.t_ns, e.t_ns), kBarH, colour_of(s.kind),
                       xml_escape(display_name(b)), b.arg, rel(b.t_ns), rel(e.t_ns), since(b.t_ns, e.t_ns));
      }
      for (const Event& e : ev) {
        if (!is_instant(Kind(e.kind))) continue;
        fmt::format_to(
            out,
            "<line class=\"instant\" x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1:.2f}\" y2=\"{2:.2f}\" stroke=\"{3}\">"
            "<title>{4} (arg {5}): {6} ns</title></line>\n",
            x(e.t_ns), y, y + kLaneH, colour_of(Kind(e.kind)), xml_escape(display_name(e)), e.arg, rel(e.t_ns));
      }
      body += "</g>\n";
      y += kLaneH + kLaneGap;

      if (!has_s_issue(ev)) continue;
      const Lifetimes life = lifetimes_of(ev);
      const std::array<std::pair<const char*, const std::vector<Lifetime>*>, 3> rows = {
          {{"S", &life.s}, {"P", &life.p}, {"O", &life.o}}};
      for (const auto& [tile, intervals] : rows) {
        fmt::format_to(out, "<g class=\"lifetime\" data-cta=\"{}\" data-writer=\"{}\" data-tile=\"{}\">\n", c, w, tile);
        fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" class=\"tiny\">{} tiles</text>\n",
                       kLeft - 8, y + kLifeH, tile);
        for (const Lifetime& l : *intervals)
          fmt::format_to(out,
                         "<rect class=\"life-{}\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\">"
                         "<title>{} of tile {}: {}–{} ns, {} ns</title></rect>\n",
                         tile, x(l.from), y, width(l.from, l.to), kLifeH, tile, l.arg, rel(l.from), rel(l.to),
                         since(l.from, l.to));
        body += "</g>\n";
        y += kLifeH + kLifeGap;
      }
      y += kLaneGap;
    }
    y += kCtaGap;
  }
  const double lanes_bottom = y;

  // The time axis above the lanes, its grid through them.
  std::string axis;
  auto aout = std::back_inserter(axis);
  const double axis_y = kTitleH + kAxisH - 6;
  fmt::format_to(aout, "<line class=\"axis\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>\n", kLeft,
                 kLeft + kPlotW, axis_y, axis_y);
  const double step = tick_step(span_ns, 8);
  for (double ns = 0; ns <= span_ns + step * 1e-9; ns += step) {
    const double tx = kLeft + ns * kPlotW / span_ns;
    fmt::format_to(aout, "<line class=\"grid\" x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\"/>\n", tx,
                   axis_y, lanes_bottom);
    fmt::format_to(aout, "<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\" class=\"small\">{}</text>\n", tx,
                   axis_y - 4, time_label(ns, step));
  }
  fmt::format_to(
      aout, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" class=\"small\">time since the first event</text>\n",
      kLeft - 24, axis_y - 4);

  // The legend: span colours, instant ticks, lifetimes; wrapped to the plot's width.
  std::string legend;
  auto lout = std::back_inserter(legend);
  enum class Swatch { box, tick, bar };
  double lx = kLeft, ly = lanes_bottom + 10;
  auto entry = [&](Swatch swatch, std::string_view paint, std::string_view name) {
    if (lx + 130 > kLeft + kPlotW) lx = kLeft, ly += 18;
    if (swatch == Swatch::box)
      fmt::format_to(lout, "<rect class=\"legend\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"10\" fill=\"{}\"/>",
                     lx, ly, paint);
    else if (swatch == Swatch::tick)
      fmt::format_to(
          lout,
          "<line class=\"legend\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"{3}\" "
          "stroke-width=\"2\"/>",
          lx + 6, ly, ly + 10, paint);
    else
      fmt::format_to(lout, "<rect class=\"legend {}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"5\"/>", paint, lx,
                     ly + 3);
    fmt::format_to(lout, "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"small\">{}</text>\n", lx + 16, ly + 9,
                   xml_escape(name));
    lx += 130;
  };
  entry(Swatch::box, colour_of(Kind::tile_begin), "tile");
  entry(Swatch::box, colour_of(Kind::wait_begin), "wait");
  entry(Swatch::box, colour_of(Kind::s_issue), "S=QK^T (bar)");
  entry(Swatch::box, colour_of(Kind::softmax_begin), "softmax");
  entry(Swatch::box, colour_of(Kind::pv_issue), "P·V (bar)");
  entry(Swatch::box, colour_of(Kind::epilogue_begin), "epilogue");
  entry(Swatch::tick, colour_of(Kind::rescale_taken), "rescale taken");
  entry(Swatch::tick, colour_of(Kind::rescale_skipped), "rescale skipped");
  entry(Swatch::tick, colour_of(Kind::tma_issue), "tma issue");
  entry(Swatch::tick, colour_of(Kind::dq_add), "dq add");
  entry(Swatch::bar, "life-S-key", "S tile lifetime");
  entry(Swatch::bar, "life-P-key", "P tile lifetime");
  entry(Swatch::bar, "life-O-key", "O tile lifetime");
  const double height = ly + 24;

  std::string svg;
  auto sout = std::back_inserter(svg);
  fmt::format_to(sout,
                 "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
                 "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"sans-serif\" font-size=\"11\">\n",
                 kWidth, height);
  svg +=
      "<style>\n"
      ".label{fill:#222}.small{font-size:9px;fill:#444}.tiny{font-size:7px;fill:#444}.lane-bg{fill:#f6f6f6}\n"
      ".axis{stroke:#444}.grid{stroke:#e2e2e2}.instant{stroke-width:1}\n"
      ".life-S,.life-S-key{fill:#4393c3}.life-P,.life-P-key{fill:#9970ab}.life-O,.life-O-key{fill:#e08214}\n"
      "</style>\n";
  fmt::format_to(sout, "<rect x=\"0\" y=\"0\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"white\"/>\n", kWidth, height);
  fmt::format_to(sout, "<text x=\"10\" y=\"18\" font-size=\"14\">{}</text>\n", xml_escape(t.kernel));
  fmt::format_to(sout, "<text x=\"10\" y=\"34\" class=\"small\">{} · {} events dropped · {:.0f} ns shown</text>\n",
                 xml_escape(t.shape), t.dropped(), span_ns);
  svg += axis;
  svg += body;
  svg += legend;
  svg += "</svg>\n";
  return svg;
}

// ---- summary -----------------------------------------------------------------------------------------------

namespace {

// The q-quantile of sorted values, interpolating linearly between ranks (numpy's default).
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - double(lo)) * (sorted[hi] - sorted[lo]);
}

std::string duration(double ns) {
  if (ns < 1e3) return fmt::format("{:.0f} ns", ns);
  if (ns < 1e6) return fmt::format("{:.2f} µs", ns / 1e3);
  return fmt::format("{:.3f} ms", ns / 1e6);
}

}  // namespace

Summary summarize(const Trace& t) {
  Summary s;
  s.kernel = t.kernel, s.shape = t.shape, s.ctas = t.ctas;
  s.dropped = t.dropped();
  s.writers.resize(t.writers_per_cta);
  std::vector<double> tile_ns(t.writers_per_cta, 0.0);
  for (uint32_t w = 0; w < t.writers_per_cta; ++w) s.writers[w].writer = t.writer_names[w];

  TimeRange whole;
  double tensor_busy = 0, tensor_window = 0;
  std::vector<double> gaps;
  for (uint32_t c = 0; c < t.ctas; ++c) {
    TimeRange cta, tiles;  // tiles: lo = first tile_begin, hi = last tile_end
    bool any_begin = false, any_end = false;
    std::vector<std::pair<uint64_t, uint64_t>> tensor;  // [issue, done] of every writer's S and P·V
    for (uint32_t w = 0; w < t.writers_per_cta; ++w) {
      const auto ev = t.slice(c, w);
      if (ev.empty()) continue;
      TimeRange slice;
      for (const Event& e : ev) {
        slice.add(e.t_ns);
        if (Kind(e.kind) == Kind::tile_begin) tiles.lo = std::min(tiles.lo, e.t_ns), any_begin = true;
        if (Kind(e.kind) == Kind::tile_end) tiles.hi = std::max(tiles.hi, e.t_ns), any_end = true;
        if (Kind(e.kind) == Kind::rescale_taken) ++s.rescale_taken;
        if (Kind(e.kind) == Kind::rescale_skipped) ++s.rescale_skipped;
        if (Kind(e.kind) == Kind::rescale_rows) ++s.rescale_row_samples, s.rescale_rows += uint64_t(std::max(e.arg, 0));
      }
      s.events += ev.size();
      cta.add(slice.lo), cta.add(slice.hi);
      WriterStats& ws = s.writers[w];
      ws.active_ns += double(slice.hi - slice.lo);
      for (const Span& sp : match_spans(ev)) {
        const uint64_t from = ev[sp.begin].t_ns, to = ev[sp.end].t_ns;
        if (sp.kind == Kind::wait_begin) {
          ws.wait_ns += double(since(from, to));
          ws.wait_ns_by[name_in(kWaitNames, ev[sp.begin].arg)] += double(since(from, to));
        }
        if (sp.kind == Kind::tile_begin) ++ws.tiles, tile_ns[w] += double(since(from, to));
        if (is_async_span(sp.kind)) tensor.emplace_back(from, std::max(from, to));
      }
    }
    if (cta.empty()) continue;
    whole.add(cta.lo), whole.add(cta.hi);

    // The tensor core's busy union inside the CTA's window, and the idle gaps around it.
    const uint64_t lo = any_begin ? tiles.lo : cta.lo, hi = any_end ? tiles.hi : cta.hi;
    if (hi <= lo) continue;
    tensor_window += double(hi - lo);
    std::sort(tensor.begin(), tensor.end());
    uint64_t cursor = lo;  // the end of the union so far (or the window's start)
    for (auto [from, to] : tensor) {
      from = std::clamp(from, lo, hi), to = std::clamp(to, lo, hi);
      if (from > cursor) gaps.push_back(double(from - cursor));
      if (to > cursor) tensor_busy += double(to - std::max(from, cursor)), cursor = to;
    }
    if (hi > cursor) gaps.push_back(double(hi - cursor));
  }

  s.elapsed_ns = whole.empty() ? 0 : double(whole.hi - whole.lo);
  for (uint32_t w = 0; w < t.writers_per_cta; ++w) {
    WriterStats& ws = s.writers[w];
    ws.busy_fraction = ws.active_ns > 0 ? 1.0 - ws.wait_ns / ws.active_ns : 0.0;
    ws.mean_tile_ns = ws.tiles > 0 ? tile_ns[w] / double(ws.tiles) : 0.0;
  }
  s.tensor_busy_fraction = tensor_window > 0 ? tensor_busy / tensor_window : 0.0;
  std::sort(gaps.begin(), gaps.end());
  s.tensor_idle_gap_median_ns = quantile(gaps, 0.5);
  s.tensor_idle_gap_p90_ns = quantile(gaps, 0.9);
  s.tensor_idle_gap_max_ns = gaps.empty() ? 0.0 : gaps.back();
  const uint64_t decisions = s.rescale_taken + s.rescale_skipped;
  s.rescale_taken_fraction = decisions > 0 ? double(s.rescale_taken) / double(decisions) : 0.0;
  // Rows: each decision of a warpgroup's recording warp covers its 16 rows; a taken one says how many moved.
  s.rescale_row_fraction = decisions > 0 && s.rescale_row_samples > 0
                               ? double(s.rescale_rows) / (16.0 * double(decisions))
                               : 0.0;
  return s;
}

std::string to_text(const Summary& s) {
  std::string r;
  auto out = std::back_inserter(r);
  fmt::format_to(out, "kernel  {}\nshape   {}\n", s.kernel, s.shape);
  fmt::format_to(out, "{} CTAs, {} events recorded, {} dropped, {} from the first event to the last\n", s.ctas,
                 s.events, s.dropped, duration(s.elapsed_ns));
  if (s.dropped > 0)
    fmt::format_to(out,
                   "WARNING: {} events were dropped (full slices): the figures below cover the recorded events only; "
                   "record with a larger capacity\n",
                   s.dropped);

  size_t name_w = 6;
  for (const auto& w : s.writers) name_w = std::max(name_w, w.writer.size());
  fmt::format_to(out, "\n{:<{}}  {:>12}  {:>12}  {:>6}  {:>7}  {:>12}\n", "writer", name_w, "active", "waiting", "busy",
                 "tiles", "mean tile");
  for (const auto& w : s.writers)
    fmt::format_to(out, "{:<{}}  {:>12}  {:>12}  {:>5.1f}%  {:>7}  {:>12}\n", w.writer, name_w, duration(w.active_ns),
                   duration(w.wait_ns), 100.0 * w.busy_fraction, w.tiles, duration(w.mean_tile_ns));
  // Where the waiting went, per writer: each kind of wait as a share of the writer's active time.
  fmt::format_to(out, "\nwaiting for, % of active time\n");
  for (const auto& w : s.writers) {
    if (w.wait_ns_by.empty()) continue;
    fmt::format_to(out, "{:<{}} ", w.writer, name_w);
    for (const auto& [what, ns] : w.wait_ns_by)
      fmt::format_to(out, " {} {:.1f}%", what, w.active_ns > 0 ? 100.0 * ns / w.active_ns : 0.0);
    fmt::format_to(out, "\n");
  }

  fmt::format_to(out, "\ntensor core  busy {:.1f}% of the CTAs' active windows; idle gaps: median {}, p90 {}, max {}\n",
                 100.0 * s.tensor_busy_fraction, duration(s.tensor_idle_gap_median_ns),
                 duration(s.tensor_idle_gap_p90_ns), duration(s.tensor_idle_gap_max_ns));
  fmt::format_to(out, "rescale      taken {}, skipped {} ({:.1f}% taken)\n", s.rescale_taken, s.rescale_skipped,
                 100.0 * s.rescale_taken_fraction);
  if (s.rescale_row_samples > 0)
    fmt::format_to(out,
                   "rescale rows {} of {} row decisions moved their max ({:.2f}%; {:.1f} of 16 rows per taken tile; "
                   "the recording warp's rows)\n",
                   s.rescale_rows, 16 * (s.rescale_taken + s.rescale_skipped), 100.0 * s.rescale_row_fraction,
                   double(s.rescale_rows) / double(s.rescale_row_samples));
  return r;
}

json to_json(const Summary& s) {
  json writers = json::array();
  for (const auto& w : s.writers)
    writers.push_back({{"writer", w.writer},
                       {"active_ns", w.active_ns},
                       {"wait_ns", w.wait_ns},
                       {"wait_ns_by", w.wait_ns_by},
                       {"busy_fraction", w.busy_fraction},
                       {"tiles", w.tiles},
                       {"mean_tile_ns", w.mean_tile_ns}});
  return {{"kernel", s.kernel},
          {"shape", s.shape},
          {"ctas", s.ctas},
          {"elapsed_ns", s.elapsed_ns},
          {"writers", std::move(writers)},
          {"tensor_busy_fraction", s.tensor_busy_fraction},
          {"tensor_idle_gap_median_ns", s.tensor_idle_gap_median_ns},
          {"tensor_idle_gap_p90_ns", s.tensor_idle_gap_p90_ns},
          {"tensor_idle_gap_max_ns", s.tensor_idle_gap_max_ns},
          {"rescale_taken", s.rescale_taken},
          {"rescale_skipped", s.rescale_skipped},
          {"rescale_taken_fraction", s.rescale_taken_fraction},
          {"rescale_rows", s.rescale_rows},
          {"rescale_row_fraction", s.rescale_row_fraction},
          {"events", s.events},
          {"dropped", s.dropped}};
}

}  // namespace fa4::trace
