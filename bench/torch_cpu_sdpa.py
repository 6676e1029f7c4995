#!/usr/bin/env python3
"""torch's CPU scaled_dot_product_attention, timed like `fa4 bench` (same shapes, same FLOP convention,
median of N after a warm-up), so both land in one table from one run on the same host.

FLOPs = 4 * b * h * s^2 * d (causal: visible pairs, ~half); backward = 2.5x forward.
Layout: torch takes [b, h, s, d]; inputs are made [b, s, h, d] and transposed (a view, as fa4 reads them).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def visible_pairs(s, causal):
    return s * (s + 1) / 2 if causal else s * s


def bench_one(dtype, d, s, batch, heads, causal, pass_name, iters):
    g = torch.Generator().manual_seed(1)
    shape = (batch, s, heads, d)
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).transpose(1, 2) for _ in range(3))
    if pass_name == "bwd":
        for t in (q, k, v):
            t.requires_grad_(True)
        dout = torch.randn((batch, heads, s, d), generator=g).to(dtype)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # the graph the backward replays

    def once():
        if pass_name == "fwd":
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:  # backward alone, as `fa4 bench` times it
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    once()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    flops = 4 * batch * heads * d * visible_pairs(s, causal) * (2.5 if pass_name == "bwd" else 1.0)
    return sec, flops / sec / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pass", dest="passes", nargs="+", default=["fwd", "bwd"])
    ap.add_argument("--dtype", nargs="+", default=["f32", "bf16"])
    ap.add_argument("--seqlen", nargs="+", type=int, default=[1024, 4096])
    ap.add_argument("--head-dim", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    rows = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for dt in a.dtype:
        for d in a.head_dim:
            for s in a.seqlen:
                for p in a.passes:
                    sec, tflops = bench_one(dtypes[dt], d, s, a.batch, a.heads, False, p, a.iters)
                    print(f"{p:<4} {dt:<5} {d:>4} {s:>7} {a.batch:>5} {a.heads:>5} {sec * 1e3:>11.2f} {tflops:>9.4f}", flush=True)
                    rows.append({"impl": "torch-cpu-sdpa", "dtype": dt, "d": d, "seqlen": s, "batch": a.batch,
                                 "heads": a.heads, "causal": False, "pass": p, "tflops": tflops, "ms": sec * 1e3})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
