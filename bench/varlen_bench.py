#!/usr/bin/env python3
"""Variable-length prefill benchmark (issue 12): 16k tokens packed in sequences of 100..4000 tokens, fa4's varlen
forward beside fa4's dense forward at the mean length and SDPA cuDNN on the zero-padded batch, one process, one
GPU.

Bar (issue 12): fa4-varlen reaches >= 90% of fa4-dense's TFLOP/s at the mean length (goal 97%).
Implementations:
  fa4-varlen   flash_attn_varlen_func on the packed tensors (one launch for every sequence);
  fa4-dense    flash_attn_func on [n_seqs, mean_len, h, d]: the same token count as one dense batch;
  sdpa-padded  SDPA's cuDNN backend on [n_seqs, max_len, h, d] zero-padded (the padding is computed: its
               TFLOP/s counts only the real pairs, which is what the padding costs a user);
  sdpa-flash-padded  the same through SDPA's FLASH backend (FlashAttention-2);
  flex-document      FlexAttention (torch.compile'd) on the packed tensors with a document mask (a key is visible
               to a query of the same sequence; causal: and not after it), its output checked against fa4-varlen's
               (relative L2 <= 2e-2, else a note and no row); --no-flex skips it (its compile takes a while).
TFLOP/s: 4·d per visible (query, key) pair of every sequence (causal: the bottom-right triangle), per second.
Timing: CUDA events around `--calls` back-to-back calls, after a warm-up; the median of `--reps`.
Correctness: fa4-varlen's output of every sequence against SDPA's math backend in fp32 on that sequence alone
(relative L2 error <= 2e-2) before anything is timed.

Rows ("pass": "fwd-varlen"): impl, dtype, d, heads, causal, tokens, n_seqs, min_len, max_len, mean_len, ms,
tflops, ratio_to_dense. Writes --out/<date>-<commit>-varlen.json and .md; prints the markdown.

  PYTHONPATH=python FA4_LIBRARY=build-sm90/libfa4.so python3 bench/varlen_bench.py --commit <sha>
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


def lengths(tokens, low, high, seed):
    """Random lengths in [low, high] that sum to exactly `tokens` (the last one takes the remainder, >= 1)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    while sum(out) < tokens:
        n = int(torch.randint(low, high + 1, (1,), generator=gen))
        out.append(min(n, tokens - sum(out)))
    return out


def pairs(n, causal):
    return n * (n + 1) // 2 if causal else n * n


def flex_attention_or_note(notes):
    """torch.compile'd flex_attention, or None with a note saying why it cannot run here."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
        return torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # noqa: BLE001 -- a peer that cannot run is a note, not an abort
        notes.append(f"flex-document: unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return None


def flex_document(flex, doc, causal, q, k, v, reference, label, notes):
    """A call of FlexAttention on the packed [1, h, tokens, d] view with a document mask, checked against fa4's
    varlen output (`reference`); None (and a note) if it cannot run or disagrees."""
    from torch.nn.attention.flex_attention import create_block_mask

    def document(b, h, q_idx, kv_idx):
        same = doc[q_idx] == doc[kv_idx]
        return same & (q_idx >= kv_idx) if causal else same
    try:
        tokens = q.shape[0]
        mask = create_block_mask(document, B=None, H=None, Q_LEN=tokens, KV_LEN=tokens, device=q.device)
        qf, kf, vf = (x.transpose(0, 1)[None] for x in (q, k, v))

        def run():
            return flex(qf, kf, vf, block_mask=mask)
        with torch.no_grad():
            got = run()[0].transpose(0, 1).float()
        err = ((got - reference.float()).norm() / reference.float().norm()).item()
        if err > 2e-2:
            notes.append(f"flex-document {label}: differs from fa4-varlen (relative L2 {err:.3g}); not timed")
            return None
        return run
    except Exception as e:  # noqa: BLE001
        notes.append(f"flex-document {label}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--min-len", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=4000)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dims", default="64,128", help="comma-separated (default 64,128)")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--no-flex", action="store_true", help="leave out flex-document (its compile is slow)")
    a = ap.parse_args()
    if not 1 <= a.min_len <= a.max_len or a.tokens < 1 or a.heads < 1 or a.calls < 1 or a.reps < 1:
        ap.error("expected 1 <= --min-len <= --max-len, and --tokens, --heads, --calls, --reps >= 1")
    if not torch.cuda.is_available():
        sys.exit("varlen_bench.py: needs a CUDA GPU (torch.cuda.is_available() is False)")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    lens = lengths(a.tokens, a.min_len, a.max_len, a.seed)
    n_seqs, max_len = len(lens), max(lens)
    mean_len = round(a.tokens / n_seqs)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    rows, notes = [], []
    flex = None if a.no_flex else flex_attention_or_note(notes)
    doc = torch.repeat_interleave(torch.arange(n_seqs, device="cuda"), torch.tensor(lens, device="cuda"))
    print(f"{n_seqs} sequences, {a.tokens} tokens, lengths {min(lens)}..{max_len} (mean {mean_len})", flush=True)
    for d in (int(x) for x in a.head_dims.split(",")):
        for causal in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(a.seed * 1000 + d)
            q, k, v = (torch.randn(a.tokens, a.heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                       for _ in range(3))
            # Correctness first: every sequence against the fp32 math reference of that sequence alone.
            with torch.no_grad():
                out = fa4.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=causal)
            worst = 0.0
            for b in range(n_seqs):
                s, e = int(cu[b]), int(cu[b + 1])
                qs, ks, vs = (x[s:e].float().transpose(0, 1)[None] for x in (q, k, v))
                with sdpa_kernel(SDPBackend.MATH):
                    # bottom-right causal = top-left for a square sequence
                    ref = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
                got = out[s:e].float().transpose(0, 1)[None]
                worst = max(worst, ((got - ref).norm() / ref.norm()).item())
            label = f"d={d} {'causal' if causal else 'full'}"
            if worst > 2e-2:
                notes.append(f"fa4-varlen {label}: FAILED the check (worst relative L2 error {worst:.3g}); not timed")
                continue
            flops = 4 * d * a.heads * sum(pairs(n, causal) for n in lens)
            dense_flops = 4 * d * a.heads * n_seqs * pairs(mean_len, causal)
            qd, kd, vd = (torch.randn(n_seqs, mean_len, a.heads, d, device="cuda", dtype=torch.bfloat16)
                          for _ in range(3))
            qp, kp, vp = (torch.zeros(n_seqs, a.heads, max_len, d, device="cuda", dtype=torch.bfloat16)
                          for _ in range(3))
            for b in range(n_seqs):
                s, e = int(cu[b]), int(cu[b + 1])
                for src, dst in ((q, qp), (k, kp), (v, vp)):
                    dst[b, :, : e - s] = src[s:e].transpose(0, 1)

            def sdpa(backend):
                def run():
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(qp, kp, vp, is_causal=causal)
                return run

            impls = {
                "fa4-varlen": (lambda: fa4.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=causal),
                               flops),
                "fa4-dense": (lambda: fa4.flash_attn_func(qd, kd, vd, causal=causal), dense_flops),
                "sdpa-padded": (sdpa(SDPBackend.CUDNN_ATTENTION), flops),
                "sdpa-flash-padded": (sdpa(SDPBackend.FLASH_ATTENTION), flops),
            }
            if flex is not None:
                run_flex = flex_document(flex, doc, causal, q, k, v, out, label, notes)
                if run_flex is not None:
                    impls["flex-document"] = (run_flex, flops)
            measured = {}
            with torch.no_grad():
                for name, (fn, fl) in impls.items():
                    try:
                        ms = time_ms(fn, a.calls, a.reps)
                    except Exception as e:  # a peer that cannot run: a note, no row
                        notes.append(f"{name} {label}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                        continue
                    measured[name] = fl / (ms * 1e-3) / 1e12
                    rows.append({"impl": name, "pass": "fwd-varlen", "dtype": "bf16", "d": d, "heads": a.heads,
                                 "causal": causal, "tokens": a.tokens, "n_seqs": n_seqs, "min_len": min(lens),
                                 "max_len": max_len, "mean_len": mean_len, "ms": round(ms, 4),
                                 "tflops": round(measured[name], 2), "rel_err": float(f"{worst:.3g}")})
            for r in rows:
                if r["d"] == d and r["causal"] == causal and "fa4-dense" in measured:
                    r["ratio_to_dense"] = round(r["tflops"] / measured["fa4-dense"], 3)
            print(f"{label}: " + ", ".join(f"{n} {t:.0f} TFLOP/s" for n, t in measured.items()), flush=True)
            del qd, kd, vd, qp, kp, vp
            torch.cuda.empty_cache()

    date = datetime.date.today().isoformat()
    props = torch.cuda.get_device_properties(0)
    result = {"commit": a.commit, "gpu": props.name, "date": date, "lengths": lens, "rows": rows, "notes": notes}
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"{date}-{a.commit[:7]}-varlen")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# Varlen prefill, {props.name}, commit {a.commit[:7]}, {date}",
             f"bf16, {a.heads} heads, {a.tokens} tokens in {n_seqs} sequences of {min(lens)}..{max_len} (mean "
             f"{mean_len}); median of {a.reps} × {a.calls} calls.", "",
             "| d | mask | fa4-varlen TFLOP/s (/ dense) | fa4-dense at the mean length | sdpa-padded (cuDNN) | "
             "sdpa-flash-padded | flex-document |", "|---|---|---|---|---|---|---|"]
    for d in sorted({r["d"] for r in rows}):
        for causal in (False, True):
            cell = {r["impl"]: r for r in rows if r["d"] == d and r["causal"] == causal}
            if not cell:
                continue
            fmt = lambda n: f"{cell[n]['tflops']:.0f}" if n in cell else "—"  # noqa: E731
            ratio = cell.get("fa4-varlen", {}).get("ratio_to_dense")
            lines.append(f"| {d} | {'causal' if causal else 'full'} | {fmt('fa4-varlen')}"
                         f"{f' ({ratio:.2f})' if ratio else ''} | {fmt('fa4-dense')} | {fmt('sdpa-padded')} | "
                         f"{fmt('sdpa-flash-padded')} | {fmt('flex-document')} |")
    lines += [""] + [f"- {n}" for n in notes]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 2 if any("FAILED" in n for n in notes) else 0


if __name__ == "__main__":
    sys.exit(main())
