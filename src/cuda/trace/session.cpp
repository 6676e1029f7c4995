// The trace session (session.hpp): one process-wide armed state; the launch that recorded last keeps its
// device buffer until take_last() copies it out. A trace build is a diagnostic build, so plain cudaMalloc per
// armed launch is fine here (the untraced library allocates nothing of this).
#include "cuda/trace/session.hpp"

#include <mutex>
#include <stdexcept>
#include <utility>

namespace fa4::trace {
namespace {

struct Recording {
  std::string kernel;
  uint32_t ctas = 0, capacity = 0;
  std::vector<std::string> writer_names;
  Event* events = nullptr;
  uint32_t* counts = nullptr;
};

struct State {
  std::mutex mutex;
  bool armed = false;
  uint32_t capacity = 0;
  std::optional<Recording> last;
};

State& state() {
  static State s;
  return s;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("fa4 trace: ") + what + ": " + cudaGetErrorString(e));
}

void release(Recording& r) {
  cudaFree(r.events);
  cudaFree(r.counts);
  r.events = nullptr, r.counts = nullptr;
}

}  // namespace

bool compiled_in() {
#if FA4_TRACE
  return true;
#else
  return false;
#endif
}

void arm(uint32_t capacity) {
  if (!compiled_in())
    throw std::runtime_error("fa4 trace: this build does not record traces; configure with -DFA4_TRACE=ON "
                             "(a separate build directory: the recording perturbs the kernels)");
  if (capacity == 0) throw std::runtime_error("fa4 trace: capacity must be at least 1 event per writer");
  std::lock_guard lock(state().mutex);
  state().armed = true;
  state().capacity = capacity;
}

void disarm() {
  std::lock_guard lock(state().mutex);
  state().armed = false;
}

Sink begin_launch(const std::string& kernel, uint32_t ctas, std::vector<std::string> writer_names,
                  cudaStream_t stream) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.armed || ctas == 0) return {};
  if (writer_names.empty() || writer_names.size() > kMaxWritersPerCta)
    throw std::runtime_error("fa4 trace: a launch named " + std::to_string(writer_names.size()) + " writers");
  if (s.last) release(*s.last);
  Recording r;
  r.kernel = kernel, r.ctas = ctas, r.capacity = s.capacity, r.writer_names = std::move(writer_names);
  const size_t slices = size_t(ctas) * r.writer_names.size();
  check(cudaMalloc(&r.events, slices * r.capacity * sizeof(Event)), "allocating the event buffer");
  check(cudaMalloc(&r.counts, slices * sizeof(uint32_t)), "allocating the event counts");
  check(cudaMemsetAsync(r.counts, 0, slices * sizeof(uint32_t), stream), "zeroing the event counts");
  Sink sink;
  sink.events = r.events, sink.counts = r.counts;
  sink.ctas = ctas, sink.writers_per_cta = uint32_t(r.writer_names.size()), sink.capacity = r.capacity;
  s.last = std::move(r);
  return sink;
}

std::optional<Trace> take_last() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.last) return std::nullopt;
  Recording r = std::move(*s.last);
  s.last.reset();
  Trace t;
  t.kernel = r.kernel;
  t.ctas = r.ctas, t.writers_per_cta = uint32_t(r.writer_names.size()), t.capacity = r.capacity;
  t.writer_names = r.writer_names;
  const size_t slices = size_t(t.ctas) * t.writers_per_cta;
  t.counts.resize(slices);
  t.events.resize(slices * t.capacity);
  try {
    check(cudaDeviceSynchronize(), "the traced launch");
    check(cudaMemcpy(t.counts.data(), r.counts, slices * sizeof(uint32_t), cudaMemcpyDeviceToHost), "copying counts");
    check(cudaMemcpy(t.events.data(), r.events, t.events.size() * sizeof(Event), cudaMemcpyDeviceToHost),
          "copying events");
  } catch (...) {
    release(r);
    throw;
  }
  release(r);
  return t;
}

}  // namespace fa4::trace
