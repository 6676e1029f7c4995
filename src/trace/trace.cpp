// The host side of a kernel trace: slices, the binary file, span matching and validation (trace.hpp).
#include "trace/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>

namespace fa4::trace {

// The file stores integers little-endian and events verbatim: both are a plain memcpy only on a little-endian
// host with the device's Event layout (the recorder's one 16-byte store writes exactly these offsets).
static_assert(std::endian::native == std::endian::little, "the trace file is read and written with memcpy");
static_assert(offsetof(Event, t_ns) == 0 && offsetof(Event, sm) == 8 && offsetof(Event, kind) == 10 &&
                  offsetof(Event, pad) == 11 && offsetof(Event, arg) == 12,
              "Event's layout is the file's");

namespace {

// a * b, or nothing when it does not fit in 64 bits (a corrupt header must not wrap around into a small size).
std::optional<uint64_t> mul(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

// The first inconsistency between the trace's vectors and its header, or an empty string.
std::string size_problem(const Trace& t) {
  const uint64_t slots = uint64_t(t.ctas) * t.writers_per_cta;
  if (t.writer_names.size() != t.writers_per_cta)
    return fmt::format("{} writer names for {} writers per CTA", t.writer_names.size(), t.writers_per_cta);
  if (t.counts.size() != slots)
    return fmt::format("{} counts for {} CTAs × {} writers", t.counts.size(), t.ctas, t.writers_per_cta);
  const auto events = mul(slots, t.capacity);
  if (!events || t.events.size() != *events)
    return fmt::format("{} events for {} CTAs × {} writers × capacity {}", t.events.size(), t.ctas, t.writers_per_cta,
                       t.capacity);
  return {};
}

// The begin kind an end kind closes (kind_count: not a span end).
constexpr Kind begin_of(Kind end) {
  for (uint8_t k = 0; k < uint8_t(Kind::kind_count); ++k)
    if (span_end_of(Kind(k)) == end) return Kind(k);
  return Kind::kind_count;
}

std::string_view name_of(Kind k) { return k < Kind::kind_count ? kKindNames[size_t(k)] : "?"; }

// The one matcher behind match_spans() (lenient) and validate() (strict): with `problem` set it stops at the
// first violation and describes it there; without, it skips what it cannot match.
std::vector<Span> match(std::span<const Event> ev, std::string* problem) {
  std::vector<Span> spans;
  std::vector<uint32_t> open;            // the writer's own open spans, innermost last
  std::deque<uint32_t> s_open, pv_open;  // tensor-core groups in flight, oldest first
  auto queue_of = [&](Kind begin) -> std::deque<uint32_t>& { return begin == Kind::s_issue ? s_open : pv_open; };
  for (uint32_t i = 0; i < ev.size(); ++i) {
    const Kind k = Kind(ev[i].kind);
    if (k >= Kind::kind_count) {
      if (problem) {
        *problem = fmt::format("event {} has kind {} (kinds end at {})", i, ev[i].kind, uint8_t(Kind::kind_count));
        return spans;
      }
      continue;
    }
    if (span_end_of(k) != Kind::kind_count) {  // a begin
      if (is_async_span(k))
        queue_of(k).push_back(i);
      else
        open.push_back(i);
      continue;
    }
    const Kind begin = begin_of(k);
    if (begin == Kind::kind_count) continue;  // an instant
    if (is_async_span(begin)) {
      auto& q = queue_of(begin);
      if (q.empty()) {
        if (problem) {
          *problem = fmt::format("event {} {} without its {}", i, name_of(k), name_of(begin));
          return spans;
        }
        continue;
      }
      spans.push_back({begin, q.front(), i});
      q.pop_front();
      continue;
    }
    if (!open.empty() && Kind(ev[open.back()].kind) == begin) {
      spans.push_back({begin, open.back(), i});
      open.pop_back();
      continue;
    }
    if (problem) {
      const auto outer =
          std::find_if(open.rbegin(), open.rend(), [&](uint32_t j) { return Kind(ev[j].kind) == begin; });
      if (outer == open.rend())
        *problem = fmt::format("event {} {} without its {}", i, name_of(k), name_of(begin));
      else
        *problem = fmt::format(
            "spans improperly nested: event {} {} closes the {} of event {} while the {} of event {} "
            "is still open",
            i, name_of(k), name_of(begin), *outer, name_of(Kind(ev[open.back()].kind)), open.back());
      return spans;
    }
  }
  return spans;
}

// Reads the file's fields front to back; every failure names the file and what was being read.
class Reader {
 public:
  Reader(std::string path, std::vector<char> bytes) : path_(std::move(path)), bytes_(std::move(bytes)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(fmt::format("read_trace: '{}': {}", path_, what));
  }
  const char* take(uint64_t n, std::string_view what) {
    if (n > left())
      fail(fmt::format("truncated: {} needs {} bytes at offset {}, the file has {} left", what, n, pos_, left()));
    const char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint32_t u32(std::string_view what) {
    uint32_t v;
    std::memcpy(&v, take(sizeof v, what), sizeof v);
    return v;
  }
  std::string str(std::string_view what) {
    const uint32_t n = u32(what);
    return std::string(take(n, what), n);
  }
  uint64_t left() const { return bytes_.size() - pos_; }

 private:
  std::string path_;
  std::vector<char> bytes_;
  uint64_t pos_ = 0;
};

void put_u32(std::ofstream& f, uint32_t v) { f.write(reinterpret_cast<const char*>(&v), sizeof v); }
void put_str(std::ofstream& f, const std::string& s, const std::string& path) {
  if (s.size() > std::numeric_limits<uint32_t>::max())
    throw std::runtime_error(fmt::format("write_trace: '{}': a string of {} bytes does not fit", path, s.size()));
  put_u32(f, uint32_t(s.size()));
  f.write(s.data(), std::streamsize(s.size()));
}

}  // namespace

uint32_t Trace::recorded(uint32_t cta, uint32_t writer) const {
  if (cta >= ctas || writer >= writers_per_cta)
    throw std::out_of_range(
        fmt::format("slice (CTA {}, writer {}) outside {} CTAs × {} writers", cta, writer, ctas, writers_per_cta));
  return std::min(counts.at(size_t(cta) * writers_per_cta + writer), capacity);
}

std::span<const Event> Trace::slice(uint32_t cta, uint32_t writer) const {
  const uint32_t n = recorded(cta, writer);
  const size_t start = (size_t(cta) * writers_per_cta + writer) * capacity;
  if (start + capacity > events.size())
    throw std::out_of_range(fmt::format("slice (CTA {}, writer {}) past the {} events", cta, writer, events.size()));
  return std::span<const Event>(events).subspan(start, n);
}

uint64_t Trace::dropped() const {
  uint64_t d = 0;
  for (uint32_t c : counts) d += c > capacity ? c - capacity : 0;
  return d;
}

void write_trace(const Trace& t, const std::string& path) {
  if (const std::string p = size_problem(t); !p.empty())
    throw std::runtime_error(fmt::format("write_trace: '{}': inconsistent trace: {}", path, p));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error(fmt::format("write_trace: '{}': cannot open for writing", path));
  f.write(kMagic.data(), std::streamsize(kMagic.size()));
  put_u32(f, kFormatVersion);
  put_str(f, t.kernel, path);
  put_str(f, t.shape, path);
  put_u32(f, t.ctas);
  put_u32(f, t.writers_per_cta);
  put_u32(f, t.capacity);
  for (const auto& name : t.writer_names) put_str(f, name, path);
  f.write(reinterpret_cast<const char*>(t.counts.data()), std::streamsize(t.counts.size() * sizeof(uint32_t)));
  f.write(reinterpret_cast<const char*>(t.events.data()), std::streamsize(t.events.size() * sizeof(Event)));
  f.close();  // flushes: a full disk shows up here, not silently
  if (!f) throw std::runtime_error(fmt::format("write_trace: '{}': write failed", path));
}

Trace read_trace(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error(fmt::format("read_trace: '{}': cannot open", path));
  std::vector<char> bytes(static_cast<size_t>(f.tellg()));
  f.seekg(0);
  f.read(bytes.data(), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error(fmt::format("read_trace: '{}': read failed", path));
  Reader r(path, std::move(bytes));

  if (std::string_view(r.take(kMagic.size(), "the magic"), kMagic.size()) != kMagic)
    r.fail(fmt::format("not a trace file (bad magic, expected \"{}\")", kMagic));
  if (const uint32_t version = r.u32("the version"); version != kFormatVersion)
    r.fail(fmt::format("unsupported version {} (this build reads version {})", version, kFormatVersion));

  Trace t;
  t.kernel = r.str("the kernel name");
  t.shape = r.str("the shape");
  t.ctas = r.u32("ctas");
  t.writers_per_cta = r.u32("writers_per_cta");
  t.capacity = r.u32("capacity");
  for (uint32_t w = 0; w < t.writers_per_cta; ++w) t.writer_names.push_back(r.str(fmt::format("writer name {}", w)));

  // Sizes are checked against what is left before anything is allocated: a corrupt header fails here, cleanly.
  const uint64_t slots = uint64_t(t.ctas) * t.writers_per_cta;
  const auto count_bytes = mul(slots, sizeof(uint32_t));
  const auto events = mul(slots, t.capacity);
  const auto event_bytes = events ? mul(*events, sizeof(Event)) : std::nullopt;
  if (!count_bytes || !event_bytes)
    r.fail(fmt::format("sizes do not match: {} CTAs × {} writers × capacity {} overflows", t.ctas, t.writers_per_cta,
                       t.capacity));
  t.counts.resize(slots);
  std::memcpy(t.counts.data(), r.take(*count_bytes, "the counts"), *count_bytes);
  const char* ev = r.take(*event_bytes, "the events");
  t.events.resize(*events);
  std::memcpy(static_cast<void*>(t.events.data()), ev, *event_bytes);
  if (r.left() != 0)
    r.fail(fmt::format("sizes do not match: {} bytes after the last slice ({} CTAs × {} writers × capacity {})",
                       r.left(), t.ctas, t.writers_per_cta, t.capacity));
  return t;
}

std::vector<Span> match_spans(std::span<const Event> slice) { return match(slice, nullptr); }

void validate(const Trace& t) {
  if (t.writers_per_cta > kMaxWritersPerCta)
    throw std::runtime_error(
        fmt::format("invalid trace: {} writers per CTA (at most {})", t.writers_per_cta, kMaxWritersPerCta));
  if (const std::string p = size_problem(t); !p.empty()) throw std::runtime_error("invalid trace: " + p);
  for (uint32_t c = 0; c < t.ctas; ++c)
    for (uint32_t w = 0; w < t.writers_per_cta; ++w) {
      const auto ev = t.slice(c, w);
      auto fail = [&](const std::string& what) {
        throw std::runtime_error(
            fmt::format("invalid trace: CTA {} · {} (writer {}): {}", c, t.writer_names[w], w, what));
      };
      for (uint32_t i = 1; i < ev.size(); ++i)
        if (ev[i].t_ns < ev[i - 1].t_ns)
          fail(fmt::format("timestamps decreasing: event {} {} at {} ns after event {} at {} ns", i,
                           name_of(Kind(ev[i].kind)), ev[i].t_ns, i - 1, ev[i - 1].t_ns));
      std::string problem;
      match(ev, &problem);
      if (!problem.empty()) fail(problem);
    }
}

}  // namespace fa4::trace
