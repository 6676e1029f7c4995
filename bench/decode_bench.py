#!/usr/bin/env python3
"""Decode benchmark (issue 12): one query token per sequence against a long contiguous KV cache, fa4 beside SDPA
cuDNN in one process on one GPU, as a fraction of a device copy's bandwidth measured in the same run.

Implementations: fa4 (num_splits 0: the library's fill rule, GQA packing), fa4-nosplit (num_splits 1: one CTA per
(sequence, head) walks all keys; the pre-split kernel's behaviour), fa4-kvcache (flash_attn_with_kvcache on the
same contiguous cache, cache_seqlens a device tensor of s_k), fa4-paged64 (flash_attn_with_kvcache on the same keys
in 64-row pages handed out in a random order, page_table [b, s_k / 64]; its rows have page_size 64), fa4-paged64-inorder (the same with the pages in order), sdpa-cudnn (torch SDPA's cuDNN backend on
[b, h, s, d] views with enable_gqa, else on K/V expanded to the query heads: a note says which).

Shapes: bf16, d = 128, 32 query / 8 kv heads, seqlen_q = 1; (batch, seqlen_k) from --shapes.
Timing: N calls captured in one CUDA graph, cycling over enough separate K/V sets that a cycle reads more than
2x L2 (no call finds its K/V in L2), replayed after a warm-up; per call = the replay's event time / N, the median
of --reps replays. This is the end-to-end cost of a call from a graph (launches of the split and combine kernels
included), without the host.
Bandwidth: K and V bytes of one call / its time (gbps), and bw_fraction = gbps / the copy rate (read + write
bytes of a 2 GiB device-to-device copy, / its time, in the same run). A pure read stream can pass 1.0.
Correctness: each implementation's output on the first set (its first two sequences) is compared with SDPA's
math backend in fp32 on the upcast inputs (relative L2 error <= 2e-2, finite) before it is timed; a failure is reported and not timed.

Rows ("pass": "decode"): impl, dtype, d, batch, heads, heads_kv, seqlen_q, seqlen_k, page_size (0: contiguous),
us, gbps, bw_fraction (with --kernels also "kernels": per-kernel durations and gaps in one replay). Writes --out/<date>-<commit>-decode.json and .md; prints the markdown.

  PYTHONPATH=python FA4_LIBRARY=build-sm90/libfa4.so python3 bench/decode_bench.py --commit <sha>
"""
import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fa4  # noqa: E402

DEFAULT_SHAPES = "1x1024,1x4096,1x8192,1x32768,1x131072,8x4096,8x16384,8x65536,64x4096,64x32768"
HEADS, HEADS_KV, D = 32, 8, 128
IMPLS = ("fa4", "fa4-nosplit", "fa4-kvcache", "fa4-paged64", "fa4-paged64-inorder", "sdpa-cudnn")
PAGE = 64  # fa4-paged64's page size


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        b, _, s = item.strip().partition("x")
        if not b.isdigit() or not s.isdigit() or int(b) < 1 or int(s) < 1:
            raise argparse.ArgumentTypeError(f"expected BATCHxSEQLEN_K items such as 1x4096, got {item!r}")
        shapes.append((int(b), int(s)))
    return shapes


def copy_gbps(reps):
    n = 1 << 30  # 2 GiB of bf16
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del src, dst
    return 2 * n * 2 / sorted(times)[len(times) // 2] / 1e9


def sdpa_cudnn(q, k, v, note):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    bhsd = [x.transpose(1, 2) for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        if note.get("gqa", True):
            try:
                return torch.nn.functional.scaled_dot_product_attention(*bhsd, enable_gqa=True).transpose(1, 2)
            except RuntimeError as e:
                note["gqa"] = False
                note["why"] = str(e).splitlines()[0][:160]
        group = q.shape[2] // k.shape[2]
        kx, vx = (t.repeat_interleave(group, dim=1) for t in bhsd[1:])
        return torch.nn.functional.scaled_dot_product_attention(bhsd[0], kx, vx).transpose(1, 2)


def reference(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    group = q.shape[2] // k.shape[2]
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
    kf, vf = (t.repeat_interleave(group, dim=1) for t in (kf, vf))
    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(qf, kf, vf).transpose(1, 2)


def time_graph(fn, sets, calls, reps, profile=False):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(len(sets)):  # warm-up outside the capture (workspace, cuDNN plans)
            fn(*sets[i])
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*sets[i % len(sets)])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    kernels = graph_kernels(graph, calls) if profile else None
    del graph
    return sorted(times)[len(times) // 2], kernels


def graph_kernels(graph, calls):
    """One replay under torch.profiler (CUPTI): per kernel name its median duration, and the median gap from a
    kernel's end to the next one's start (by the pair of names), and a call's span, in µs: where one call's time
    goes. A programmatic dependent launch starts before its predecessor ends (a negative gap), and its duration
    then includes its wait for that predecessor."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    events.sort(key=lambda e: e["ts"])
    def short(e):  # "void ns::(anonymous namespace)::name<...>(...)" -> "name"
        name = re.sub(r"^void ", "", e["name"].replace("(anonymous namespace)::", ""))
        return re.split(r"[<(]", name)[0].split("::")[-1][:48]
    durs, gaps = {}, {}
    for i, e in enumerate(events):
        durs.setdefault(short(e), []).append(e["dur"])
        if i:
            prev = events[i - 1]
            gaps.setdefault(f"{short(prev)} -> {short(e)}", []).append(e["ts"] - prev["ts"] - prev["dur"])
    med = lambda xs: round(statistics.median(xs), 2)  # noqa: E731
    out = {"kernels": {k: {"us": med(v), "count": len(v)} for k, v in durs.items()},
           "gaps": {k: {"us": med(v), "count": len(v)} for k, v in gaps.items()}}
    if events and len(events) % calls == 0:  # a call's span: its first kernel's start to its last one's end
        per = len(events) // calls
        out["call_span_us"] = med([max(e["ts"] + e["dur"] for e in events[i:i + per]) - events[i]["ts"]
                                   for i in range(0, len(events), per)])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=parse_shapes, default=parse_shapes(DEFAULT_SHAPES),
                    help=f"comma-separated BATCHxSEQLEN_K (default {DEFAULT_SHAPES})")
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help=f"comma-separated subset of {','.join(IMPLS)}, and fa4-sN: fa4 with N forced splits")
    ap.add_argument("--calls", type=int, default=20, help="calls per graph (default 20)")
    ap.add_argument("--reps", type=int, default=7, help="graph replays; the median is reported (default 7)")
    ap.add_argument("--kernels", action="store_true",
                    help="after timing, one replay under torch.profiler: each kernel's median duration and the gaps "
                         "between kernels (row key \"kernels\"), printed")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args()
    impls = [x.strip() for x in a.impls.split(",") if x.strip()]
    for x in impls:
        if x not in IMPLS and not (x.startswith("fa4-s") and x[5:].isdigit() and int(x[5:]) >= 1):
            ap.error(f"--impls: unknown implementation {x!r}; expected a subset of {','.join(IMPLS)}, or fa4-sN "
                     f"(N >= 1 forced splits)")
    if a.calls < 1 or a.reps < 1:
        ap.error(f"--calls and --reps: expected >= 1, got {a.calls} and {a.reps}")
    if not torch.cuda.is_available():
        sys.exit("decode_bench.py: needs a CUDA GPU (torch.cuda.is_available() is False)")

    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    copy = copy_gbps(a.reps)
    print(f"device copy: {copy:.0f} GB/s (read + write)", flush=True)
    fns = {"fa4": lambda q, k, v: fa4.flash_attn_func(q, k, v, num_splits=0),
           "fa4-nosplit": lambda q, k, v: fa4.flash_attn_func(q, k, v, num_splits=1)}
    for x in impls:  # fa4-sN: N forced splits (the fill rule's alternatives, for choosing it from data)
        if x.startswith("fa4-s"):
            fns[x] = lambda q, k, v, n=int(x[5:]): fa4.flash_attn_func(q, k, v, num_splits=n)
    paged, lens = {}, {}  # per K/V set: its paged copy (k_pages, v_pages, page_table); per batch: cache_seqlens
    fns["fa4-kvcache"] = lambda q, k, v: fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens[k.shape[:2]])
    fns["fa4-paged64"] = lambda q, k, v: fa4.flash_attn_with_kvcache(q, *paged[id(k)])
    fns["fa4-paged64-inorder"] = lambda q, k, v: fa4.flash_attn_with_kvcache(q, *paged[("inorder", id(k))])
    sdpa_note = {}
    fns["sdpa-cudnn"] = lambda q, k, v: sdpa_cudnn(q, k, v, sdpa_note)
    rows, notes = [], []
    for batch, seqlen_k in a.shapes:
        kv_bytes = 2 * batch * seqlen_k * HEADS_KV * D * 2
        nsets = max(1, min(a.calls, math.ceil(2 * l2 / kv_bytes) + 1))
        gen = torch.Generator(device="cuda").manual_seed(batch * 1000003 + seqlen_k)
        sets = [tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
                      for shape in ((batch, 1, HEADS, D), (batch, seqlen_k, HEADS_KV, D), (batch, seqlen_k, HEADS_KV, D)))
                for _ in range(nsets)]
        lens[(batch, seqlen_k)] = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
        for inorder in (False, True):
            if ("fa4-paged64-inorder" if inorder else "fa4-paged64") not in impls or seqlen_k % PAGE != 0:
                continue
            for _, k, v in sets:
                pages = batch * seqlen_k // PAGE
                order = (torch.arange(pages, device="cuda") if inorder
                         else torch.randperm(pages, device="cuda", generator=gen)).to(torch.int32)
                k_pages, v_pages = torch.empty_like(k).view(pages, PAGE, HEADS_KV, D), torch.empty_like(v).view(pages, PAGE, HEADS_KV, D)
                k_pages[order.long()] = k.view(pages, PAGE, HEADS_KV, D)
                v_pages[order.long()] = v.view(pages, PAGE, HEADS_KV, D)
                paged[("inorder", id(k)) if inorder else id(k)] = (k_pages, v_pages, None, None, None,
                                                                   order.view(batch, seqlen_k // PAGE))
        checked = min(batch, 2)  # the fp32 reference of the first two sequences (b = 64 in fp32 would not fit)
        want = reference(*(t[:checked] for t in sets[0]))
        for impl in impls:
            label = f"{impl} b={batch} s_k={seqlen_k}"
            try:
                got = fns[impl](*sets[0])[:checked].float()
                err = ((got - want).norm() / want.norm()).item()
                if not math.isfinite(err) or not torch.isfinite(got).all() or err > 2e-2:
                    notes.append(f"{label}: FAILED the check (relative L2 error {err:.3g}); not timed")
                    continue
                us, kernels = time_graph(fns[impl], sets, a.calls, a.reps, a.kernels)
            except Exception as e:  # a peer that cannot run this shape: a note, no row
                notes.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            gbps = kv_bytes / (us * 1e-6) / 1e9
            rows.append({"impl": impl, "pass": "decode", "dtype": "bf16", "d": D, "batch": batch, "heads": HEADS,
                         "heads_kv": HEADS_KV, "seqlen_q": 1, "seqlen_k": seqlen_k,
                         "page_size": PAGE if impl.startswith("fa4-paged64") else 0,
                         "us": round(us, 2), "gbps": round(gbps, 1), "bw_fraction": round(gbps / copy, 3),
                         "rel_err": float(f"{err:.3g}")})
            print(f"{label}: {us:.1f} us, {gbps:.0f} GB/s, {gbps / copy:.0%} of copy", flush=True)
            if kernels is not None:
                rows[-1]["kernels"] = kernels
                print(f"  call span: {kernels.get('call_span_us', '?')} us", flush=True)
                for kind in ("kernels", "gaps"):
                    print(f"  {kind}: " + "; ".join(f"{k} {v['us']} us (x{v['count']})"
                                                    for k, v in kernels[kind].items()), flush=True)
        del sets, want
        paged.clear()
        torch.cuda.empty_cache()
    if "sdpa-cudnn" in impls and sdpa_note.get("gqa") is False:
        notes.append(f"sdpa-cudnn ran on K/V expanded to the query heads (enable_gqa refused: {sdpa_note['why']}); "
                     f"its bandwidth counts the unexpanded bytes")

    date = datetime.date.today().isoformat()
    result = {"commit": a.commit, "gpu": props.name, "date": date, "copy_gbps": round(copy, 1),
              "calls_per_graph": a.calls, "reps": a.reps, "rows": rows, "notes": notes}
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"{date}-{a.commit[:7]}-decode")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# Decode, {props.name}, commit {a.commit[:7]}, {date}",
             f"bf16, d = {D}, {HEADS}/{HEADS_KV} heads, one query, contiguous cache (fa4-paged64: {PAGE}-row pages); CUDA-graph replay, {a.calls} calls "
             f"per graph, median of {a.reps}; copy {copy:.0f} GB/s.", "",
             "| batch | s_k | " + " | ".join(f"{x} µs (of copy)" for x in impls) + " |",
             "|---|---|" + "---|" * len(impls)]
    for batch, seqlen_k in a.shapes:
        cells = []
        for impl in impls:
            r = [x for x in rows if x["impl"] == impl and x["batch"] == batch and x["seqlen_k"] == seqlen_k]
            cells.append(f"{r[0]['us']:.1f} ({r[0]['bw_fraction']:.0%})" if r else "—")
        lines.append(f"| {batch} | {seqlen_k} | " + " | ".join(cells) + " |")
    lines += [""] + [f"- {n}" for n in notes]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 2 if any("FAILED" in n and n.startswith("fa4") for n in notes) else 0


if __name__ == "__main__":
    sys.exit(main())
