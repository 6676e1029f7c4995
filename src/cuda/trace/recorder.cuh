// The device side of kernel traces (src/trace/format.hpp): a Recorder per writer thread appends timestamped
// events to its own slice of the launch's buffer. Compiled in only with FA4_TRACE; otherwise the Recorder is an
// empty object, FA4_TRACE_RECORD / FA4_TRACE_FINISH expand to nothing and FA4_TRACE_SINK(p) to an empty Sink, so the untraced kernels are unchanged (their PTX is compared with and without the
// instrumentation: docs/trace.md).
#pragma once

#include <cstdint>

#include "trace/format.hpp"

#if FA4_TRACE
#include <cuda/ptx>
#endif

namespace fa4::trace {

#if FA4_TRACE

// The launch's sink, from kernel parameters that carry one (FwdParams, BwdParams in trace builds).
#define FA4_TRACE_SINK(params) ((params).trace)
// Call sites go through these macros, which vanish in untraced builds: a no-op member call would still make
// lambdas capture the recorder and perturb the untraced kernel's code.
#define FA4_TRACE_RECORD(recorder, ...) (recorder).record(__VA_ARGS__)
#define FA4_TRACE_FINISH(recorder) (recorder).finish()

class Recorder {
 public:
  // `writer`: the slot of this role in the CTA (the launcher names the slots); only the thread passing
  // is_writer_thread records, every other thread's calls return at once.
  __device__ Recorder(const Sink& sink, uint32_t writer, bool is_writer_thread) : capacity_(sink.capacity) {
    if (is_writer_thread && sink.events != nullptr && writer < sink.writers_per_cta && blockIdx.x < sink.ctas) {
      const uint64_t slot = uint64_t(blockIdx.x) * sink.writers_per_cta + writer;
      events_ = sink.events + slot * sink.capacity;
      count_ = sink.counts + slot;
    }
  }

  __device__ void record(Kind kind, int32_t arg = 0) {
    if (events_ == nullptr) return;
    if (recorded_ < capacity_) {
      const uint64_t t = ::cuda::ptx::get_sreg_globaltimer();
      const uint32_t sm = ::cuda::ptx::get_sreg_smid();
      // Event's layout: t_ns, then sm (16 bits), kind (8), pad (8), then arg: one 16-byte store.
      reinterpret_cast<uint4*>(events_)[recorded_] =
          make_uint4(uint32_t(t), uint32_t(t >> 32), (sm & 0xffffu) | (uint32_t(kind) << 16), uint32_t(arg));
    }
    ++recorded_;  // counted past the capacity too: the host reports what was dropped
  }
  template <class E>
  __device__ void record(Kind kind, E what) {
    record(kind, static_cast<int32_t>(what));
  }

  // At the role's end: the number of events asked for (> capacity: the slice overflowed).
  __device__ void finish() const {
    if (count_ != nullptr) *count_ = recorded_;
  }

 private:
  Event* events_ = nullptr;
  uint32_t* count_ = nullptr;
  uint32_t capacity_ = 0, recorded_ = 0;
};

#else

#define FA4_TRACE_SINK(params) (::fa4::trace::Sink{})
#define FA4_TRACE_RECORD(recorder, ...) ((void)0)
#define FA4_TRACE_FINISH(recorder) ((void)0)

class Recorder {  // only passed along: every call site is a macro that expands to nothing
 public:
  __device__ Recorder(const Sink&, uint32_t, bool) {}
};

#endif

}  // namespace fa4::trace
