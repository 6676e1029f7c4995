"""CUDA-event timing shared by the bench scripts (varlen_bench.py, paged_prefill_bench.py)."""
import torch


def time_ms(fn, calls, reps):
    """Milliseconds per call: CUDA events around `calls` back-to-back calls after a warm-up, the median of `reps`."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]
