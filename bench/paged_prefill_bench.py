#!/usr/bin/env python3
"""Paged prefill benchmark (issue 12: paged prefill >= 90% of contiguous, goal 97%): a chunk of new queries against
a long KV cache, through flash_attn_with_kvcache on a paged cache (pages of --page-sizes rows, default 64, 128
and 256, in a random order) and on a contiguous one, beside flash_attn_func on the same keys as a dense tensor; one process, one GPU.

Shapes: bf16, 32 query / 8 kv heads, d = 128, causal (bottom-right: the chunk is the cache's last rows); per
(batch, cache length, chunk) from --shapes (default 1x16384x2048, 4x8192x1024, 8x4096x512).
Implementations:
  fa4-paged<P>    flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=..., page_table=...), P-row pages
                  (the kernel loads min(P, 128)-row boxes: 64-row pages take twice the TMA boxes of the others)
  fa4-paged<P>-ordered   with --ordered: the same pages in order (page table = identity), which tells the page
                  walk's locality (TLB, DRAM pages) from the paged loads' own cost
  fa4-kvcache     flash_attn_with_kvcache(q, k, v, cache_seqlens=...) on the contiguous cache
  fa4-dense       flash_attn_func(q, k, v, causal=True) on the same keys
TFLOP/s: 4·d per visible (query, key) pair, per second; ratio_to_dense = TFLOP/s / fa4-dense's.
Timing: CUDA events around --calls back-to-back calls after a warm-up, the median of --reps.
Correctness: each implementation's output against fa4-dense's (relative L2 error <= 1e-2: the same kernel math)
before it is timed.

Rows ("pass": "fwd-kvcache"): impl, dtype, d, batch, heads, heads_kv, seqlen_q, seqlen_k, page_size (0:
contiguous), ms, tflops, ratio_to_dense. Writes --out/<date>-<commit>-paged-prefill.json and .md.

  PYTHONPATH=python FA4_LIBRARY=build-sm90/libfa4.so python3 bench/paged_prefill_bench.py --commit <sha>
"""
import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fa4  # noqa: E402
from cuda_timing import time_ms  # noqa: E402  (bench/, the script's own folder)

HEADS, HEADS_KV, D = 32, 8, 128
DEFAULT_SHAPES = "1x16384x2048,4x8192x1024,8x4096x512"
DEFAULT_PAGES = "64,128,256"


def parse_pages(text):
    try:
        pages = [int(x) for x in text.split(",")]
    except ValueError:
        pages = []
    if not pages or any(p <= 0 or p % 16 for p in pages):
        raise argparse.ArgumentTypeError(f"expected page sizes, multiples of 16, separated by commas, got {text!r}")
    return pages


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        parts = item.strip().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"expected BATCHxSEQLEN_KxCHUNK with positive integers, got {item!r}")
        b, sk, sq = map(int, parts)
        if sq > sk or sk % 256:
            raise argparse.ArgumentTypeError(f"{item!r}: expected CHUNK <= SEQLEN_K and SEQLEN_K a multiple of 256")
        shapes.append((b, sk, sq))
    return shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", type=parse_shapes, default=parse_shapes(DEFAULT_SHAPES))
    ap.add_argument("--page-sizes", type=parse_pages, default=parse_pages(DEFAULT_PAGES))
    ap.add_argument("--ordered", action="store_true", help="also each page size with its pages in order")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args()
    if a.calls < 1 or a.reps < 1:
        ap.error(f"--calls and --reps: expected >= 1, got {a.calls} and {a.reps}")
    if any(sk % page for _, sk, _ in a.shapes for page in a.page_sizes):
        ap.error("--shapes / --page-sizes: every SEQLEN_K must be a multiple of every page size")
    if not torch.cuda.is_available():
        sys.exit("paged_prefill_bench.py: needs a CUDA GPU (torch.cuda.is_available() is False)")
    props = torch.cuda.get_device_properties(0)
    rows, notes = [], []
    for batch, sk, sq in a.shapes:
        gen = torch.Generator(device="cuda").manual_seed(batch * 7919 + sk + sq)
        q = torch.randn(batch, sq, HEADS, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(batch, sk, HEADS_KV, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn_like(k)
        lens = torch.full((batch,), sk, dtype=torch.int32, device="cuda")
        fns = {"fa4-dense": lambda: fa4.flash_attn_func(q, k, v, causal=True),
               "fa4-kvcache": lambda: fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)}
        paged = {}  # page size -> (k_pages, v_pages, table), pages in a random order
        for page, ordered in [(p, o) for p in a.page_sizes for o in ((False, True) if a.ordered else (False,))]:
            pages = batch * sk // page
            order = (torch.arange(pages, device="cuda") if ordered
                     else torch.randperm(pages, device="cuda", generator=gen))
            k_pages = torch.empty(pages, page, HEADS_KV, D, device="cuda", dtype=torch.bfloat16)
            v_pages = torch.empty_like(k_pages)
            k_pages[order], v_pages[order] = k.view(pages, page, HEADS_KV, D), v.view(pages, page, HEADS_KV, D)
            name = f"fa4-paged{page}" + ("-ordered" if ordered else "")
            paged[name] = (k_pages, v_pages, order.to(torch.int32).view(batch, sk // page))
            fns[name] = (lambda kp, vp, t: lambda: fa4.flash_attn_with_kvcache(
                q, kp, vp, cache_seqlens=lens, page_table=t, causal=True))(*paged[name])
        pairs = batch * HEADS * (sq * (sk - sq) + sq * (sq + 1) // 2)
        with torch.no_grad():
            want = fns["fa4-dense"]().float()
            dense_tflops = None
            for impl in fns:
                label = f"{impl} b={batch} s_k={sk} s_q={sq}"
                got = fns[impl]().float()
                err = ((got - want).norm() / want.norm()).item()
                if not torch.isfinite(got).all() or err > 1e-2:
                    notes.append(f"{label}: FAILED the check (relative L2 error {err:.3g} against fa4-dense); not timed")
                    continue
                ms = time_ms(fns[impl], a.calls, a.reps)
                tflops = 4 * D * pairs / (ms * 1e-3) / 1e12
                if impl == "fa4-dense":
                    dense_tflops = tflops
                ratio = tflops / dense_tflops if dense_tflops else float("nan")
                rows.append({"impl": impl, "pass": "fwd-kvcache", "dtype": "bf16", "d": D, "batch": batch,
                             "heads": HEADS, "heads_kv": HEADS_KV, "seqlen_q": sq, "seqlen_k": sk,
                             "page_size": int(impl[len("fa4-paged"):].split("-")[0]) if impl.startswith("fa4-paged")
                             else 0, "pages_ordered": impl.endswith("-ordered"),
                             "ms": round(ms, 4),
                             "tflops": round(tflops, 1), "ratio_to_dense": round(ratio, 3)})
                print(f"{label}: {ms:.3f} ms, {tflops:.0f} TFLOP/s, {ratio:.2f} of dense", flush=True)
        del q, k, v, paged, fns
        torch.cuda.empty_cache()
    suffixes = ("", "-ordered") if a.ordered else ("",)
    paged_names = [f"fa4-paged{p}{suffix}" for p in a.page_sizes for suffix in suffixes]
    date = datetime.date.today().isoformat()
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"{date}-{a.commit[:7]}-paged-prefill")
    with open(stem + ".json", "w") as f:
        json.dump({"commit": a.commit, "gpu": props.name, "date": date, "rows": rows, "notes": notes}, f, indent=1)
    lines = [f"# Paged prefill, {props.name}, commit {a.commit[:7]}, {date}",
             f"bf16, d = {D}, {HEADS}/{HEADS_KV} heads, causal; a chunk of s_q queries against s_k cached keys; "
             f"median of {a.reps} × {a.calls} calls.", "",
             "| batch | s_k | s_q | fa4-dense TFLOP/s | fa4-kvcache (/ dense) | "
             + " | ".join(f"{n} (/ dense)" for n in paged_names) + " |",
             "|---|---|---|---|---|" + "---|" * len(paged_names)]
    for batch, sk, sq in a.shapes:
        cell = {}
        for r in rows:
            if (r["batch"], r["seqlen_k"], r["seqlen_q"]) == (batch, sk, sq):
                cell[r["impl"]] = f"{r['tflops']:.0f}" + ("" if r["impl"] == "fa4-dense" else f" ({r['ratio_to_dense']:.2f})")
        impls = ["fa4-dense", "fa4-kvcache"] + paged_names
        lines.append(f"| {batch} | {sk} | {sq} | " + " | ".join(cell.get(i, "—") for i in impls) + " |")
    lines += [""] + [f"- {n}" for n in notes]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 2 if notes else 0


if __name__ == "__main__":
    sys.exit(main())
