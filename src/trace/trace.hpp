// A kernel trace on the host (issue 13): what one trace-build launch recorded (src/trace/format.hpp), its file
// format, and the rules a well-formed trace follows. Plain C++, no CUDA: the collector, the CLI, the exporters
// (src/trace/export.*) and the CPU tests all work on this.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trace/format.hpp"

namespace fa4::trace {

struct Trace {
  std::string kernel;  // e.g. "sm90 fwd bf16 d128"
  std::string shape;   // free text describing the run (shape, options)
  uint32_t ctas = 0, writers_per_cta = 0, capacity = 0;
  std::vector<std::string> writer_names;  // writers_per_cta entries, e.g. {"load", "consumer 0", "consumer 1"}
  std::vector<uint32_t> counts;           // ctas * writers_per_cta: events each writer was asked to record
  std::vector<Event> events;              // ctas * writers_per_cta * capacity; slice (c, w) at (c*wpc + w)*capacity

  // Events of slice (cta, writer) actually stored: min(count, capacity).
  uint32_t recorded(uint32_t cta, uint32_t writer) const;
  // The recorded events only (never the unused or overflowed tail).
  std::span<const Event> slice(uint32_t cta, uint32_t writer) const;
  // Sum over slices of max(0, count - capacity): events asked for but lost to full slices.
  uint64_t dropped() const;
};

// ---- the file format ---------------------------------------------------------------------------------------
// Little-endian, fixed-width, no padding between fields:
//   "FA4TRACE" (8 bytes), u32 version (kFormatVersion),
//   str kernel, str shape (str: u32 byte length, then the bytes, no terminator),
//   u32 ctas, u32 writers_per_cta, u32 capacity,
//   writers_per_cta × str writer name,
//   ctas·writers_per_cta × u32 count,
//   ctas·writers_per_cta·capacity × Event (16 bytes each, verbatim: u64 t_ns, u16 sm, u8 kind, u8 pad, i32 arg),
//   and nothing after.
inline constexpr std::string_view kMagic = "FA4TRACE";
inline constexpr uint32_t kFormatVersion = 1;

// Throws std::runtime_error naming the file when it cannot be written, or when the trace's vectors do not
// have the sizes its header promises (the file would not read back).
void write_trace(const Trace& t, const std::string& path);
// Throws std::runtime_error naming the file and what is wrong: not openable, wrong magic, unsupported version,
// truncated, sizes that do not match the header, bytes left over. Does not validate() the events.
Trace read_trace(const std::string& path);

// ---- spans -------------------------------------------------------------------------------------------------
// A begin/end pair of one slice: `kind` is the begin kind, `begin`/`end` index the slice's events.
struct Span {
  Kind kind;
  uint32_t begin, end;
};

// The tensor-core spans (s_issue..s_done, pv_issue..pv_done) time asynchronous wgmma groups, not what the writer
// thread is doing: the forward's steady state issues S(n) then P·V(n-1) and waits for S(n) first, so they
// interleave by design (s_issue < pv_issue < s_done < pv_done). They are matched per kind, oldest first (wgmma
// groups retire in issue order), and need not nest with anything. Every other span (tile, wait, softmax,
// epilogue) is the writer thread's own control flow and must nest properly.
constexpr bool is_async_span(Kind begin) { return begin == Kind::s_issue || begin == Kind::pv_issue; }

// The slice's spans, ordered by their end event. Lenient, for the exporters: an end without its begin, or one
// that would close a span across an open inner one, is skipped; spans still open at the end of the slice
// (e.g. their end was dropped by an overflow) are left out.
std::vector<Span> match_spans(std::span<const Event> slice);

// Throws std::runtime_error naming the first problem: vector sizes inconsistent with ctas / writers_per_cta /
// capacity, writer_names' size, writers_per_cta > kMaxWritersPerCta, an event kind >= kind_count, timestamps
// decreasing inside a slice, an end kind without its begin, or spans improperly nested inside a slice (the
// rules above). Spans left open at the end of a slice are accepted: an overflow drops their ends.
void validate(const Trace& t);

}  // namespace fa4::trace
