// mbarrier: init, arrive, arrive with an expected transaction byte count, parity wait (through CCCL's cuda::ptx).
// All barriers here live in this CTA's shared memory and synchronise at CTA scope.
#pragma once

#include <cstdint>
#include <cuda/ptx>

// A wait that never completes (a lost arrival, a wrong expect_tx byte count, a TMA fault) would otherwise hang the
// GPU. After this much global time a waiter traps instead, and the launch fails with cudaErrorLaunchFailure.
// No legitimate wait in these kernels lasts milliseconds. Define to 0 to compile the check out (e.g. for a
// debugger session, where a breakpoint would stop the clock for one warp but not for global time).
#ifndef FA4_MBARRIER_TIMEOUT_NS
#define FA4_MBARRIER_TIMEOUT_NS 4000000000ull
#endif
// A/B candidate (off by default): the wait's slow path reads %globaltimer once per 64 polls, not on every poll.
#ifndef FA4_AB_SPIN
#define FA4_AB_SPIN 0
#endif

namespace fa4::ptx {

// One thread initialises; the caller then makes the init visible (fence_barrier_init) and syncs the CTA.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t expected_arrivals) {
  ::cuda::ptx::mbarrier_init(bar, expected_arrivals);
}

// Release semantics: this thread's earlier shared-memory writes are visible to whoever observes the phase flip.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  (void)::cuda::ptx::mbarrier_arrive(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta, ::cuda::ptx::space_shared, bar);
}

// One arrival plus `bytes` of pending transactions: the phase completes when the async copies signalling this
// barrier (TMA complete_tx) have delivered exactly that many bytes.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  (void)::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                               ::cuda::ptx::space_shared, bar, bytes);
}

// True once the phase with this parity has completed (see pipeline_state.hpp for the parity rule). The
// instruction itself suspends the thread for a hardware-chosen time before giving up, so polling it is cheap.
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
  return ::cuda::ptx::mbarrier_try_wait_parity(bar, parity);
}

// The trap sits in its own (never inlined) function: an inlined trap, even a predicated one inside asm, makes
// ptxas drop the larger setmaxnreg budget of the roles that wait (measured: the sm90 forward then spilled
// ~1 KiB per thread at d = 128 under its 240-register consumers; with the call, none).
__device__ __noinline__ inline void mbarrier_timeout_trap() { __trap(); }

// Polls until done() returns true (each poll a try_wait that suspends for a hardware-chosen time); traps after
// FA4_MBARRIER_TIMEOUT_NS. The common case, done at once, reads no timer.
template <class Done>
__device__ __forceinline__ void poll_until(Done done) {
  if (done()) return;
#if FA4_MBARRIER_TIMEOUT_NS > 0 && FA4_AB_SPIN
  // A/B: the timer is read on every 64th poll only; the watchdog's clock starts at the 64th (so a wait of fewer
  // polls reads no timer at all) and it traps FA4_MBARRIER_TIMEOUT_NS after that, checked every 64 polls.
  uint64_t start = 0;
  for (uint32_t polls = 1; !done(); ++polls) {
    if (polls % 64 != 0) continue;
    const uint64_t now = ::cuda::ptx::get_sreg_globaltimer();
    if (polls == 64)
      start = now;
    else if (now - start > static_cast<uint64_t>(FA4_MBARRIER_TIMEOUT_NS))
      mbarrier_timeout_trap();
  }
#elif FA4_MBARRIER_TIMEOUT_NS > 0
  const uint64_t start = ::cuda::ptx::get_sreg_globaltimer();
  while (!done()) {
    if (::cuda::ptx::get_sreg_globaltimer() - start > static_cast<uint64_t>(FA4_MBARRIER_TIMEOUT_NS))
      mbarrier_timeout_trap();
  }
#else
  while (!done()) {
  }
#endif
}

// Blocks until the phase with this parity has completed; traps after FA4_MBARRIER_TIMEOUT_NS.
// SuspendHintNs > 0: each poll carries that suspend-time hint, as CUTLASS's and FlashAttention-4's waits do (10 ms
// there): the waiter sleeps until the phase completes (or the hint's time passes) instead of waking after the
// hardware's own limit to poll again, each poll ~10 instructions with the watchdog's timer on the SM
// sub-partition a consumer warp issues its softmax from (perf-log F45: the forward's producer polled 3.2 M times
// at d = 128, 16k). Which waits take it is the caller's measured choice (cuda::Pipeline's parameter).
template <uint32_t SuspendHintNs = 0>
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  static_assert(FA4_MBARRIER_TIMEOUT_NS == 0 || SuspendHintNs < FA4_MBARRIER_TIMEOUT_NS,
                "a poll's suspend hint must be shorter than the watchdog's limit");
  if constexpr (SuspendHintNs > 0)
    poll_until([&] { return ::cuda::ptx::mbarrier_try_wait_parity(bar, parity, SuspendHintNs); });
  else
    poll_until([&] { return mbarrier_try_wait_parity(bar, parity); });
}

}  // namespace fa4::ptx
