// The kernel trace format (issue 13): what a trace build of the GPU kernels records, shared by the device
// recorder (src/cuda/trace/recorder.cuh), the host session that collects it, the exporters (src/trace/export.*)
// and the tests. Plain C++: no CUDA needed to read, write or test a trace.
//
// A launch records into a buffer of `ctas × writers_per_cta` slices of `capacity` events each. A writer is one
// thread that speaks for a role of a CTA (a warpgroup's elected thread, the TMA warp's leader, ...); its slot in
// the CTA says which (`writer_names`). Each writer appends to its own slice without atomics, counts every event
// it was asked to record, and stores the count at the end: count > capacity means the slice overflowed and the
// last count − capacity events were dropped (reported, never silently).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace fa4::trace {

// What happened. Spans are a begin/end pair of kinds on one writer; the rest are instants.
enum class Kind : uint8_t {
  tile_begin = 0,     // arg: the work tile (forward: linear tile index; backward: query tile m_block)
  tile_end,           //
  wait_begin,         // a wait on a pipeline or barrier; arg: the Wait being waited for
  wait_end,           //
  tma_issue,          // arg: the Operand loaded
  s_issue,            // S = Q·Kᵀ (backward: Sᵀ and dPᵀ) issued to the tensor core; arg: the kv (or query) tile
  s_done,             // ... and complete (the wgmma wait returned)
  softmax_begin,      // arg: the kv tile
  softmax_end,        //
  rescale_taken,      // the warpgroup's rows rescaled O this tile; arg: the kv tile
  rescale_skipped,    // no row's maximum grew past the threshold: no rescale; arg: the kv tile
  pv_issue,           // O += P·V (backward: dV/dK/dQ GEMMs) issued; arg: the kv (or query) tile
  pv_done,            //
  epilogue_begin,     // arg: the work tile
  epilogue_end,       //
  dq_add,             // backward: a dQ slab handed to global memory (bulk reduce-add / reds); arg: m_block
  rescale_rows,       // after a rescale_taken: arg = how many of the recording warp's 16 rows moved their max
  kind_count
};

// Pipelines and barriers a `wait_begin` names.
// peer: the backward CTA pair's dQ exchange (the peer's pushed half, or its add of this CTA's half).
enum class Wait : int32_t { q = 0, kv, k, v, tile_slot, stage_free, dq_turn, dq_buffer, barrier, peer };
// What a `tma_issue` loads.
enum class Operand : int32_t { q = 0, k, v, dout, lse, dsum, out };

inline constexpr std::array<std::string_view, static_cast<size_t>(Kind::kind_count)> kKindNames = {
    "tile_begin", "tile_end",  "wait_begin",      "wait_end",        "tma_issue", "s_issue",
    "s_done",     "softmax_begin", "softmax_end", "rescale_taken",   "rescale_skipped",
    "pv_issue",   "pv_done",   "epilogue_begin",  "epilogue_end",    "dq_add",    "rescale_rows"};

// The span a begin kind opens, and the kind that closes it (kind_count: not a span begin).
constexpr Kind span_end_of(Kind begin) {
  switch (begin) {
    case Kind::tile_begin: return Kind::tile_end;
    case Kind::wait_begin: return Kind::wait_end;
    case Kind::s_issue: return Kind::s_done;
    case Kind::softmax_begin: return Kind::softmax_end;
    case Kind::pv_issue: return Kind::pv_done;
    case Kind::epilogue_begin: return Kind::epilogue_end;
    default: return Kind::kind_count;
  }
}

// One event, 16 bytes (one vector store on the device).
struct Event {
  uint64_t t_ns;  // %globaltimer: ns, comparable across SMs
  uint16_t sm;    // %smid
  uint8_t kind;   // Kind
  uint8_t pad;
  int32_t arg;
};
static_assert(sizeof(Event) == 16, "an event is one 16-byte store");

inline constexpr uint32_t kMaxWritersPerCta = 8;
inline constexpr uint32_t kWriterNameBytes = 24;

// The device-side description of a launch's buffer (a kernel parameter in trace builds).
struct Sink {
  Event* events = nullptr;    // [ctas][writers_per_cta][capacity]
  uint32_t* counts = nullptr; // [ctas][writers_per_cta]: events each writer was asked to record
  uint32_t ctas = 0, writers_per_cta = 0, capacity = 0;
};

}  // namespace fa4::trace
