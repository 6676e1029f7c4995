#!/usr/bin/env python3
"""Host cost of one attention call from Python (issue 12: <= 30 us for the Python call, <= 10 us for C++, which
`fa4 run --host-cost` measures): microseconds of the calling thread per call over N back-to-back calls with
nothing synchronized in between (after a warm-up and a synchronization; one synchronization after, not timed).
fa4.flash_attn_func beside torch SDPA (cuDNN backend) on the same tensors, forward only, no autograd graph.

  PYTHONPATH=python FA4_LIBRARY=build-sm90/libfa4.so python3 bench/host_cost.py [--calls 200] [--json out.json]

Shapes: decode (b = 1, one query, 4096 keys, 32 query / 8 kv heads, d = 128) and a small prefill (b = 1, 512,
16 heads, d = 128), bf16. On a machine without CUDA, CPU tensors are timed instead: there the call is the
computation, so the figures say nothing about launch cost and the script says so.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fa4  # noqa: E402

SHAPES = {"decode b1 sk4096 h32/8 d128": (1, 1, 4096, 32, 8, 128),
          "prefill b1 s512 h16 d128": (1, 512, 512, 16, 16, 128)}


def per_call_us(fn, calls, device):
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    if device == "cuda":
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", help="write the rows here too")
    a = ap.parse_args()
    if a.calls < 1:
        ap.error(f"--calls: expected >= 1, got {a.calls}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = []
    for name, (b, sq, sk, h, hkv, d) in SHAPES.items():
        q = torch.randn(b, sq, h, d, device=device, dtype=dtype)
        k = torch.randn(b, sk, hkv, d, device=device, dtype=dtype)
        v = torch.randn(b, sk, hkv, d, device=device, dtype=dtype)
        with torch.no_grad():
            ours = per_call_us(lambda: fa4.flash_attn_func(q, k, v), a.calls, device)
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION if device == "cuda"
                                                else torch.nn.attention.SDPBackend.MATH):
                sdpa = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, enable_gqa=h != hkv), a.calls, device)
        rows.append({"shape": name, "device": device, "fa4_us": ours, "sdpa_us": sdpa, "calls": a.calls})
        print(f"{name:30s} fa4 {ours:8.2f} us/call   sdpa ({'cuDNN' if device == 'cuda' else 'math'}) "
              f"{sdpa:8.2f} us/call")
    if device == "cpu":
        print("note: no CUDA device: CPU tensors were timed, so these are compute times, not host launch cost")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
