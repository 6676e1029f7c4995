// Views of a kernel trace (trace.hpp): Perfetto / Chrome trace-event JSON, an SVG timeline of a few CTAs, and a
// summary (where the writers wait, how busy the tensor core is, how often the softmax rescales O).
// The exporters take any trace that read_trace() returns; run validate() first to be told about a malformed one
// (unmatched ends are skipped here, spans left open by an overflow are left out).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <map>
#include <string>
#include <vector>

#include "trace/trace.hpp"

namespace fa4::trace {

// The name an event's span or instant is shown under: "tile", "wait kv", "S=QK^T", "softmax", "P·V", "epilogue",
// "rescale taken", "rescale skipped", "rescale rows N", "tma k", "dq add" (a begin event names its span; an end
// event its span too).
std::string display_name(const Event& e);

// Chrome / Perfetto trace-event JSON (ui.perfetto.dev):
//   {"displayTimeUnit":"ns","traceEvents":[...],"otherData":{kernel, shape, ctas, writers_per_cta, capacity,
//    writer_names, events, dropped, t0_ns}}.
// pid = the SM the CTA ran on ("process_name" "SM <id>"). Each (cta, writer) is a track,
// tid = (cta·writers_per_cta + writer)·4, named "CTA <c> · <writer>": its tile, wait, softmax and epilogue spans
// as "X" events and its instants as "i" events (scope "t"). Perfetto requires the X events of a track to nest,
// and the tensor-core spans interleave (trace.hpp, is_async_span), so they get tracks of their own:
// tid + 1 "CTA <c> · <writer> · S=QK^T" and tid + 2 "CTA <c> · <writer> · P·V", present only where used.
// ts / dur are µs (Chrome's unit, fractional: ns precision) since the trace's earliest event; args: {"arg": n}.
nlohmann::json perfetto_json(const Trace& t);

// A self-contained SVG timeline of the given CTAs (a handful: ~8 stay readable). One lane per (cta, writer):
// spans as rectangles coloured per kind (nested ones inset, the tensor-core spans as bars along the lane's
// bottom edge), instants as thin ticks. A writer with s_issue events (a consumer) gets three thin lanes below
// with the lifetimes of its tiles: S from s_issue to the softmax_end that consumes it, P from softmax_end to
// the pv_done that consumes it, O from tile_begin to epilogue_end (from the first tile_begin after the previous
// epilogue: the backward's dK/dV live across a key block's query tiles). Time on x since the CTAs' first event,
// with a labelled axis; a legend at the bottom. Throws std::out_of_range for a CTA the trace does not have.
std::string timeline_svg(const Trace& t, const std::vector<uint32_t>& ctas);

struct WriterStats {  // aggregated over all CTAs for one writer slot
  std::string writer;
  double active_ns = 0;      // sum over CTAs of (last event − first event) of the slice
  double wait_ns = 0;        // time inside wait spans
  double busy_fraction = 0;  // 1 − wait_ns / active_ns (0 if no activity)
  std::map<std::string, double> wait_ns_by;  // wait_ns by what was waited for (Wait names: "dq_turn", "q", ...)
  uint64_t tiles = 0;        // completed tile spans
  double mean_tile_ns = 0;
};

struct Summary {
  std::string kernel, shape;
  uint32_t ctas = 0;
  double elapsed_ns = 0;  // latest event − earliest event over the trace
  std::vector<WriterStats> writers;
  // Tensor core: per CTA, the union of all its writers' [s_issue, s_done] and [pv_issue, pv_done] intervals is
  // busy; idle = the gaps of that union inside the CTA's active window [first tile_begin, last tile_end] (each
  // end falls back to the CTA's first / last event), leading and trailing gaps included.
  double tensor_busy_fraction = 0;  // sum busy / sum window, over CTAs
  // Over the idle gaps of all CTAs; percentiles interpolate linearly between ranks (numpy's default).
  double tensor_idle_gap_median_ns = 0, tensor_idle_gap_p90_ns = 0, tensor_idle_gap_max_ns = 0;
  uint64_t rescale_taken = 0, rescale_skipped = 0;  // summed
  double rescale_taken_fraction = 0;                // taken / (taken + skipped), 0 if none
  // Per row (rescale_rows events; traces from before them have none): rows of the recording warps whose max
  // moved, summed; over 16 rows per decision. Sampled: one warp (16 of 64 rows) per warpgroup.
  uint64_t rescale_rows = 0, rescale_row_samples = 0;
  double rescale_row_fraction = 0;
  uint64_t events = 0, dropped = 0;                 // recorded, and lost to overflowed slices
};

Summary summarize(const Trace& t);
std::string to_text(const Summary& s);     // a readable multi-line report
nlohmann::json to_json(const Summary& s);  // the fields above under their own names; writers as an array

}  // namespace fa4::trace
