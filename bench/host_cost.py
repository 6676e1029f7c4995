#!/usr/bin/env python3
"""Host cost of one attention call from Python (issue 12: <= 30 us for the Python call, <= 10 us for C++, which
`fa4 run --host-cost` measures): microseconds of the calling thread per call over N back-to-back calls with
nothing synchronized in between (after a warm-up and a synchronization; one synchronization after, not timed).
fa4.flash_attn_func beside torch SDPA (cuDNN backend) on the same tensors, forward only, no autograd graph.

  PYTHONPATH=python FA4_LIBRARY=build-sm90/libfa4.so python3 bench/host_cost.py [--calls 200] [--json out.json]
                                                                                   [--breakdown]

Shapes: decode (b = 1, one query, 4096 keys, 32 query / 8 kv heads, d = 128) and a small prefill (b = 1, 512,
16 heads, d = 128), bf16; and the same decode through flash_attn_with_kvcache on a paged cache (64-row pages, one
key appended: an engine's decode step; SDPA has no paged form, so no peer there). Each figure is the best of
--reps repetitions of --calls calls (the median too): the host's own noise is large (perf-log F4). On a machine
without CUDA, CPU tensors are timed instead: there the call is the computation, so the figures say nothing about
launch cost and the script says so.

--breakdown also times the pieces of the KV-cache call one at a time (each over the same calls and reps): where
the Python side's microseconds go beside the library call's own (`fa4 run --kvcache ... --host-cost` times that
from C++). The pieces overlap (a piece's figure includes what it calls), so they do not sum to the call.
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


def per_call_us(fn, calls, device, reps):
    """(best, median) microseconds per call over `reps` repetitions of `calls` back-to-back calls."""
    fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        if device == "cuda":
            torch.cuda.synchronize()
    times.sort()
    return times[0], times[len(times) // 2]


def kvcache_pieces(args, calls, device, reps):
    """(piece, (best, median) us) for the pieces of flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
    cache_seqlens=lens, page_table=table), each timed alone on the same tensors: the call, its body without the
    argument checks, the library call with descriptors built beforehand, and each step the body takes."""
    from fa4 import _capi, _torch as ft  # the package's internals: what the call is made of
    q, k_cache, v_cache, k_new, v_new, lens, table = args
    call = "fa4.flash_attn_with_kvcache"
    impl_args = (q, k_cache, v_cache, k_new, v_new, lens, table, None, None, False, -1, -1, 0.0, 0)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    q_d, kc_d, vc_d, out_d = (ft.describe(call, n, t) for n, t in (("q", q), ("k_cache", k_cache),
                                                                     ("v_cache", v_cache), ("out", out)))
    kn_d, vn_d = ft.describe(call, "k", k_new), ft.describe(call, "v", v_new)
    kvcache = _capi.KvCache(lens.data_ptr(), table.data_ptr(), table.shape[1], kn_d, vn_d)
    options = _capi.options(call)
    stream = ft._stream(q)
    q_kind = ft._kind(call, "q", q)
    plain = (q, k_cache, v_cache, k_new, v_new, lens, table, None)
    pieces = [
        ("flash_attn_with_kvcache (the call)",
         lambda: fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, page_table=table)),
        ("_forward_kvcache_impl (the body, no argument checks)",
         lambda: ft._forward_kvcache_impl(*impl_args, need_lse=False)),
        ("_capi.forward_kvcache (ctypes + the library call)",
         lambda: _capi.forward_kvcache(q_d, kc_d, vc_d, out_d, None, kvcache, options, None, 0, stream)),
        ("torch.empty_like(q) (out; q is contiguous)", lambda: torch.empty_like(q)),
        ("_described_unit(q)", lambda: ft._described_unit(call, "q", q)),
        ("_int32_metadata(page_table)",
         lambda: ft._int32_metadata(call, "page_table", table, q, q_kind, 2, q.shape[0])),
        ("_capi.KvCache(...)", lambda: _capi.KvCache(lens.data_ptr(), table.data_ptr(), table.shape[1], kn_d, vn_d)),
        ("_capi.options(call) (cached)", lambda: _capi.options(call)),
        ("_plain_call (8 arguments)", lambda: ft._plain_call(plain)),
        ("_launch_on(q's kind) (device and stream)", lambda: ft._launch_on(q_kind)),
        ("_increment_version((k_cache, v_cache))", lambda: ft._increment_version((k_cache, v_cache))),
        ("torch.is_grad_enabled()", torch.is_grad_enabled),
        ("nothing (a lambda's call)", lambda: None),
    ]
    with torch.no_grad():
        return [(piece, per_call_us(fn, calls, device, reps)) for piece, fn in pieces]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--breakdown", action="store_true", help="also time the KV-cache call's pieces one by one")
    a = ap.parse_args()
    if a.calls < 1 or a.reps < 1:
        ap.error(f"--calls and --reps: expected >= 1, got {a.calls} and {a.reps}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = []
    for name, (b, sq, sk, h, hkv, d) in SHAPES.items():
        q = torch.randn(b, sq, h, d, device=device, dtype=dtype)
        k = torch.randn(b, sk, hkv, d, device=device, dtype=dtype)
        v = torch.randn(b, sk, hkv, d, device=device, dtype=dtype)
        with torch.no_grad():
            ours = per_call_us(lambda: fa4.flash_attn_func(q, k, v), a.calls, device, a.reps)
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION if device == "cuda"
                                                else torch.nn.attention.SDPBackend.MATH):
                sdpa = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, enable_gqa=h != hkv), a.calls, device, a.reps)
        rows.append({"shape": name, "device": device, "fa4_us": ours[0], "fa4_us_median": ours[1],
                     "sdpa_us": sdpa[0], "sdpa_us_median": sdpa[1], "calls": a.calls, "reps": a.reps})
        print(f"{name:30s} fa4 {ours[0]:8.2f} us/call (median {ours[1]:.2f})   sdpa "
              f"({'cuDNN' if device == 'cuda' else 'math'}) {sdpa[0]:8.2f} (median {sdpa[1]:.2f})")
    # An engine's decode step: the paged cache read in place, one key appended.
    b, sk, h, hkv, d, page = 1, 4096, 32, 8, 128, 64
    k_cache = torch.randn(b * sk // page + 1, page, hkv, d, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(b * sk // page, device=device).to(torch.int32).reshape(b, sk // page)
    lens = torch.full((b,), sk - 1, dtype=torch.int32, device=device)
    q = torch.randn(b, 1, h, d, device=device, dtype=dtype)
    k_new, v_new = (torch.randn(b, 1, hkv, d, device=device, dtype=dtype) for _ in range(2))
    with torch.no_grad():
        ours = per_call_us(lambda: fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens,
                                                               page_table=table), a.calls, device, a.reps)
    name = "kvcache decode sk4096 page64"
    rows.append({"shape": name, "device": device, "fa4_us": ours[0], "fa4_us_median": ours[1], "calls": a.calls,
                 "reps": a.reps})
    print(f"{name:30s} fa4 {ours[0]:8.2f} us/call (median {ours[1]:.2f})   (no SDPA peer: no paged form)")
    if a.breakdown:
        args = (q, k_cache, v_cache, k_new, v_new, lens, table)
        for piece, us in kvcache_pieces(args, a.calls, device, a.reps):
            rows.append({"shape": name, "piece": piece, "device": device, "fa4_us": us[0], "fa4_us_median": us[1],
                         "calls": a.calls, "reps": a.reps})
            print(f"  {piece:58s} {us[0]:8.2f} us/call (median {us[1]:.2f})")
    if device == "cpu":
        print("note: no CUDA device: CPU tensors were timed, so these are compute times, not host launch cost")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
