#!/usr/bin/env python3
"""GPU attention benchmark: fa4 against its peers, in one process on one GPU (DESIGN.md §5).

Implementations (--impls):
  fa4         fa4.flash_attn_func (the sm_90a kernels; its autograd runs the custom op fa4::backward); where
              fa4.supports refuses a shape, a note with the library's reason, no row
  sdpa-cudnn  torch SDPA, cuDNN backend   (sdpa_kernel(SDPBackend.CUDNN_ATTENTION))
  sdpa-flash  torch SDPA, FLASH backend   (sdpa_kernel(SDPBackend.FLASH_ATTENTION): FlashAttention-2)
  flex        FlexAttention, torch.compile'd (causal through a block mask); by default only at --flex-seqlens

Shapes: bf16, 16k tokens (batch = 16384 / seqlen), hidden 2048 (heads = 2048 / d; --hidden another, e.g. 3072 for
d = 192), seqlen_q == seqlen_k.
Inputs are made [b, s, h, d]; SDPA and flex get [b, h, s, d] transpose views of the same data (for s_q == s_k
SDPA's top-left causal equals fa4's bottom-right). FLOPs = 4·b·h·s²·d, halved for causal; backward = 2.5× forward.

--pass bwd (or both): the backward alone. Per input set the forward runs once, untimed, and each timed call is
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) on that retained graph: the same autograd path for
every implementation (fa4: the custom op fa4::backward; SDPA: its cuDNN / FLASH backward kernels; flex: its
compiled backward), the forward excluded exactly rather than subtracted.

Timing: CUDA events around each call, after a warm-up; the median of many calls; the calls cycle through enough
separate input sets that one cycle touches more than 2× L2 (so no call finds its inputs in L2). A GPU spin is
queued first so the host runs ahead of the GPU and launch overhead stays out of the numbers.

Correctness: before timing, every (impl, shape) is checked against SDPA's math backend in fp32 on upcast inputs,
on two (batch, head) slices (first and last), with NaN-poisoned outputs: relative L2 error <= --tol (bf16: 2e-2
forward, 5e-2 backward), every output finite. An implementation that fails is not timed at that (pass, d, causal)
and is reported. An implementation that raises (unsupported shape, missing backend) gets a note and no row.

Outputs in --out (default bench/results): <date>-<commit>.json, latest.json (schema {"commit", "gpu", "date",
"rows": [{"impl", "dtype", "d", "seqlen", "batch", "heads", "causal", "pass", "tflops", "ms", ...}], ...}),
<date>-<commit>.md (a table per (pass, d, causal)), <date>-<commit>.png (TFLOP/s vs seqlen). The markdown is
printed last. Exit status: 0, or 2 if fa4 failed a correctness check (results are still written).

  PYTHONPATH=python FA4_LIBRARY=build-sm90/libfa4.so python3 bench/gpu_bench.py --quick --commit <sha>
  python3 bench/gpu_bench.py --dry-run --out /tmp/x   # placeholder numbers, no GPU: tests the output plumbing only
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import signal
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = ("fa4", "fa4-det", "sdpa-cudnn", "sdpa-flash", "flex")
LABELS = {"fa4": "fa4", "fa4-det": "fa4 deterministic", "sdpa-cudnn": "SDPA cuDNN", "sdpa-flash": "SDPA FLASH (FA2)", "flex": "FlexAttention"}
TOKENS = 16384
HIDDEN = 2048
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_FLEX_SEQLENS = (2048, 8192)
QUICK_SEQLENS = (1024, 4096)
QUICK_HEAD_DIMS = (64, 128)
QUICK_FLEX_SEQLENS = (4096,)
REF_HEADS = 2  # heads per checked slice


def int_list(text):
    return [int(x) for x in text.replace(",", " ").split()] if text.strip() else []


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int_list, help=f"comma-separated (default {','.join(map(str, DEFAULT_SEQLENS))})")
    ap.add_argument("--head-dims", type=int_list, help="comma-separated (default 64,128,256)")
    ap.add_argument("--causal", choices=("0", "1", "both"), default="both")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--flex-seqlens", type=int_list,
                    help="seqlens at which flex runs (its compile is slow); default 2048,8192 (--quick: 4096); "
                         "'' = none")
    ap.add_argument("--pass", dest="passes", choices=("fwd", "bwd", "both"), default="fwd",
                    help="fwd (default), bwd (the backward alone, from a retained forward graph), or both")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--hidden", type=int, default=HIDDEN,
                    help=f"heads x head dim (default {HIDDEN}; every --head-dims must divide it)")
    ap.add_argument("--quick", action="store_true",
                    help="seqlen 1024,4096; d 64,128; causal and not; flex only at 4096 (explicit options win)")
    ap.add_argument("--out", help="output folder (default bench/results)")
    ap.add_argument("--commit", help="commit measured (default $FA4_COMMIT, else git rev-parse --short HEAD)")
    ap.add_argument("--warmup-ms", type=float, default=50.0)
    ap.add_argument("--rep-ms", type=float, default=200.0, help="timed GPU time per (impl, shape), roughly")
    ap.add_argument("--min-reps", type=int, default=20)
    ap.add_argument("--max-reps", type=int, default=300)
    ap.add_argument("--tol", type=float, help="relative L2 error allowed (default 2e-2 fwd, 5e-2 bwd)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: placeholder timings to test the output plumbing; JSON marked dry_run; never "
                         "real results")
    a = ap.parse_args(argv)
    a.impls = [x.strip() for x in a.impls.split(",") if x.strip()]
    bad = [x for x in a.impls if x not in IMPLS]
    if bad:
        ap.error(f"--impls: unknown {bad}; choose from {list(IMPLS)}")
    if a.seqlens is None:
        a.seqlens = list(QUICK_SEQLENS if a.quick else DEFAULT_SEQLENS)
    if a.head_dims is None:
        a.head_dims = list(QUICK_HEAD_DIMS if a.quick else (64, 128, 256))
    if a.flex_seqlens is None:
        a.flex_seqlens = list(QUICK_FLEX_SEQLENS if a.quick else DEFAULT_FLEX_SEQLENS)
    for s in a.seqlens:
        if s <= 0 or s > TOKENS or TOKENS % s:
            ap.error(f"--seqlens: {s} must divide {TOKENS}")
    for d in a.head_dims:
        if d <= 0 or a.hidden <= 0 or a.hidden % d:
            ap.error(f"--head-dims: {d} must divide --hidden {a.hidden}")
    a.causals = {"0": [False], "1": [True], "both": [False, True]}[a.causal]
    a.pass_list = ["fwd", "bwd"] if a.passes == "both" else [a.passes]
    if a.out is None:
        a.out = "/tmp/fa4-gpu-bench-dry-run" if a.dry_run else os.path.join(REPO, "bench", "results")
    if a.dry_run and os.path.realpath(a.out) == os.path.realpath(os.path.join(REPO, "bench", "results")):
        ap.error("--dry-run must not write into bench/results (its numbers are placeholders)")
    return a


def flops(batch, heads, seqlen, d, causal, pass_name):
    f = 4.0 * batch * heads * seqlen * seqlen * d
    if causal:
        f /= 2
    return f * (2.5 if pass_name == "bwd" else 1.0)


def resolve_commit(given):
    if given:
        return given
    if os.environ.get("FA4_COMMIT"):
        return os.environ["FA4_COMMIT"]
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def short(exc):
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


class Run:
    """Rows, notes and skip records of one run."""

    def __init__(self):
        self.rows = []
        self.skipped = []
        self.check_failures = []

    def skip(self, impl, pass_name, d, seqlen, causal, reason, quiet=False):
        self.skipped.append({"impl": impl, "pass": pass_name, "d": d, "seqlen": seqlen, "causal": causal,
                             "reason": reason})
        if not quiet:
            print(f"  note: {impl} {pass_name} d={d} s={seqlen} causal={int(causal)}: {reason}", flush=True)


# ------------------------------------------------------------------------------------------------ GPU part

class Gpu:
    """Everything that touches torch / CUDA; imported only for a real run."""

    def __init__(self, args):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.torch, self.F, self.SDPBackend, self.sdpa_kernel = torch, F, SDPBackend, sdpa_kernel
        self.args = args
        if not torch.cuda.is_available():
            raise SystemExit("gpu_bench: no CUDA device (use --dry-run to test the output plumbing)")
        self.dev = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(self.dev)
        self.gpu = props.name
        self.sms = props.multi_processor_count
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
        self.fa4 = None
        self.fa4_error = None
        self.fa4_info = {}
        self._flex = None
        self._flex_error = None
        self._block_masks = {}
        if "fa4" in args.impls or "fa4-det" in args.impls:
            self._load_fa4()

    # ---- implementations

    def _load_fa4(self):
        try:
            try:
                import fa4
            except ImportError:
                sys.path.insert(0, os.path.join(REPO, "python"))
                import fa4
            self.fa4_info = {"fa4_library": str(fa4.library_path()), "fa4_version": str(fa4.library_version())}
            fa4.flash_attn_func  # registers the torch ops
            self.fa4 = fa4
        except Exception as e:  # noqa: BLE001 -- never abort the run: peers still get measured
            self.fa4_error = short(e)
            print(f"note: fa4 unavailable, skipped: {self.fa4_error}", flush=True)

    def flex_fn(self):
        if self._flex is None and self._flex_error is None:
            try:
                import torch._dynamo.config as dcfg
                from torch.nn.attention.flex_attention import flex_attention
                # One compile per (shape, causal): raise the recompile limit, and fail (rather than silently run
                # flex eagerly, unfused) if it is ever hit.
                dcfg.recompile_limit = max(getattr(dcfg, "recompile_limit", 8), 256)
                dcfg.accumulated_recompile_limit = max(getattr(dcfg, "accumulated_recompile_limit", 256), 1024)
                dcfg.fail_on_recompile_limit_hit = True
                # Every backward here replays one retained graph (retain_graph=True, as for the other impls);
                # compiled backwards with donated buffers refuse that ("non-empty donated buffers", which left
                # flex's bwd rows empty through 2026-12-05). Donation only lets the backward reuse saved tensors'
                # memory; the kernels are the same.
                import torch._functorch.config as fcfg
                fcfg.donated_buffer = False
                self._flex = self.torch.compile(flex_attention, dynamic=False)
            except Exception as e:  # noqa: BLE001
                self._flex_error = short(e)
        if self._flex_error:
            raise RuntimeError(f"FlexAttention unavailable: {self._flex_error}")
        return self._flex

    def block_mask(self, seqlen):
        if seqlen not in self._block_masks:
            from torch.nn.attention.flex_attention import create_block_mask

            def causal_mask(b, h, q_idx, kv_idx):
                return q_idx >= kv_idx
            self._block_masks[seqlen] = create_block_mask(causal_mask, B=None, H=None, Q_LEN=seqlen, KV_LEN=seqlen,
                                                          device=self.dev)
        return self._block_masks[seqlen]

    def context(self, impl):
        if impl == "sdpa-cudnn":
            return self.sdpa_kernel(self.SDPBackend.CUDNN_ATTENTION)
        if impl == "sdpa-flash":
            return self.sdpa_kernel(self.SDPBackend.FLASH_ATTENTION)
        return contextlib.nullcontext()

    def forward_fn(self, impl, causal, seqlen):
        """f(q, k, v) -> out, all [b, s, h, d]; raises if the impl cannot run."""
        F = self.F
        if impl in ("fa4", "fa4-det"):
            if self.fa4 is None:
                raise RuntimeError(f"fa4 unavailable: {self.fa4_error}")
            fa4, det = self.fa4, impl == "fa4-det"
            return lambda q, k, v: fa4.flash_attn_func(q, k, v, causal=causal, deterministic=det)
        if impl in ("sdpa-cudnn", "sdpa-flash"):
            return lambda q, k, v: F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
        if impl == "flex":
            flex = self.flex_fn()
            mask = self.block_mask(seqlen) if causal else None
            return lambda q, k, v: flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                        block_mask=mask).transpose(1, 2)
        raise ValueError(impl)

    # ---- inputs and reference

    def make_sets(self, batch, seqlen, heads, d, pass_name):
        torch = self.torch
        shape = (batch, seqlen, heads, d)
        elem = torch.finfo(self.dtype).bits // 8
        set_bytes = 4 * math.prod(shape) * elem  # q, k, v, out (bwd touches more: this is the lower bound)
        n_sets = max(2, math.ceil(2 * self.l2 / set_bytes) + 1)
        sets = []
        for _ in range(n_sets):
            q, k, v = (torch.randn(shape, device=self.dev, dtype=self.dtype) for _ in range(3))
            if pass_name == "bwd":
                for t in (q, k, v):
                    t.requires_grad_(True)
                dout = torch.randn(shape, device=self.dev, dtype=self.dtype)
                sets.append((q, k, v, dout))
            else:
                sets.append((q, k, v))
        return sets

    def slices(self, batch, heads):
        hs = min(REF_HEADS, heads)
        first = (slice(0, 1), slice(0, hs))
        last = (slice(batch - 1, batch), slice(heads - hs, heads))
        return [first] if (batch == 1 and heads <= hs) else [first, last]

    def reference(self, s0, causal, batch, heads, pass_name):
        """fp32 SDPA (math backend) on upcast slices of set 0: [(slice, out)] or [(slice, (dq, dk, dv))]."""
        torch, F = self.torch, self.F
        refs = []
        with self.sdpa_kernel(self.SDPBackend.MATH):
            for bs, hs in self.slices(batch, heads):
                q, k, v = (t.detach()[bs, :, hs].float().transpose(1, 2) for t in s0[:3])
                if pass_name == "fwd":
                    with torch.no_grad():
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    refs.append(((bs, hs), out.transpose(1, 2)))
                else:
                    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    dout = s0[3][bs, :, hs].float().transpose(1, 2)
                    grads = torch.autograd.grad(out, (q, k, v), dout)
                    refs.append(((bs, hs), tuple(g.transpose(1, 2) for g in grads)))
        return refs

    def poison_next_allocation(self, like_shape, count=1):
        # The outputs of every implementation have the same size: without this, a kernel that writes nothing
        # could return a block the caching allocator just took back from a correct peer. Free the cache, then
        # leave `count` NaN-filled blocks of the output's size for the next allocations to pick up.
        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        poison = [torch.full(like_shape, float("nan"), device=self.dev, dtype=self.dtype) for _ in range(count)]
        del poison

    def check(self, impl, fwd, s0, refs, causal, pass_name):
        """(ok, max relative L2 error, message)."""
        torch = self.torch
        tol = self.args.tol or (2e-2 if pass_name == "fwd" else 5e-2)
        self.poison_next_allocation(s0[0].shape)
        if pass_name == "fwd":
            with torch.no_grad():
                out = fwd(*s0[:3])
            full = [("out", out)]
        else:
            out = fwd(*s0[:3])
            self.poison_next_allocation(s0[0].shape, count=3)  # dq, dk, dv
            grads = torch.autograd.grad(out, s0[:3], s0[3])
            full = list(zip(("dq", "dk", "dv"), grads))
        torch.cuda.synchronize()
        for name, t in full:
            if tuple(t.shape) != tuple(s0[0].shape):
                return False, float("nan"), f"{name} shape {list(t.shape)}, expected {list(s0[0].shape)}"
            if not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                return False, float("nan"), f"{name}: {bad} non-finite elements (unwritten or NaN/Inf)"
        worst = 0.0
        for (bs, hs), ref in refs:
            ref_list = [ref] if pass_name == "fwd" else list(ref)
            for (name, t), r in zip(full, ref_list):
                got = t.detach()[bs, :, hs].float()
                err = float((got - r).norm() / r.norm().clamp_min(1e-30))
                worst = max(worst, err)
                if not err <= tol:
                    return False, err, (f"{name} batch {bs.start} heads {hs.start}..{hs.stop - 1}: relative L2 "
                                        f"error {err:.3e} > {tol:.0e}")
        return True, worst, ""

    # ---- timing

    def time_calls(self, calls):
        """Median ms per call, cycling through calls (one per input set); CUDA events around each call."""
        torch = self.torch
        a = self.args
        n = len(calls)
        calls[0]()  # first call: compile / handle creation / autotune, untimed
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            calls[i]()
        torch.cuda.synchronize()
        est = max((time.perf_counter() - t0) * 1e3 / n, 1e-3)
        for i in range(max(2 * n, min(2000, math.ceil(a.warmup_ms / est)))):
            calls[i % n]()
        reps = int(min(a.max_reps, max(a.min_reps, math.ceil(a.rep_ms / est))))
        reps = max(n, reps - reps % n)  # whole cycles
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        torch.cuda.synchronize()
        with contextlib.suppress(Exception):  # let the host run ahead: launch overhead stays off the clock
            torch.cuda._sleep(int(min(20.0, 0.05 * reps) * 1e-3 * 1.5e9))
        for i in range(reps):
            starts[i].record()
            calls[i % n]()
            ends[i].record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
        return times[len(times) // 2], reps

    def timed_calls(self, impl, fwd, sets, pass_name):
        torch = self.torch
        if pass_name == "fwd":
            def make(s):
                def call():
                    with torch.no_grad():
                        fwd(s[0], s[1], s[2])
                return call
            return [make(s) for s in sets]
        calls = []
        for s in sets:
            out = fwd(s[0], s[1], s[2])  # the graph each backward replays (retain_graph)

            def call(out=out, s=s):
                torch.autograd.grad(out, s[:3], s[3], retain_graph=True)
            calls.append(call)
        return calls

    # ---- driver

    def run(self, run, checkpoint=None):
        a = self.args
        torch = self.torch
        print(f"gpu: {self.gpu}, {self.sms} SMs, L2 {self.l2 / 2**20:.0f} MiB; torch {torch.__version__}, "
              f"cuDNN {torch.backends.cudnn.version()}; dtype {a.dtype}; impls {','.join(a.impls)}", flush=True)
        if self.fa4_info:
            print(f"fa4: {self.fa4_info['fa4_library']} ({self.fa4_info['fa4_version']})", flush=True)
        for pass_name in a.pass_list:
            for d in a.head_dims:
                for causal in a.causals:
                    refused = {}  # impl -> reason: failed its check at this (pass, d, causal)
                    for seqlen in a.seqlens:
                        self.run_shape(run, pass_name, d, causal, seqlen, refused)
                    if checkpoint:
                        checkpoint()  # partial results survive a timeout

    def run_shape(self, run, pass_name, d, causal, seqlen, refused):
        a = self.args
        torch = self.torch
        batch, heads = TOKENS // seqlen, a.hidden // d
        impls = []
        for impl in a.impls:
            if impl == "flex" and seqlen not in a.flex_seqlens:
                run.skip(impl, pass_name, d, seqlen, causal, "not at this seqlen (--flex-seqlens)", quiet=True)
            elif impl in refused:
                run.skip(impl, pass_name, d, seqlen, causal, f"refused: {refused[impl]}", quiet=True)
            elif impl in ("fa4", "fa4-det") and self.fa4 is None:
                run.skip(impl, pass_name, d, seqlen, causal, f"fa4 unavailable: {self.fa4_error}", quiet=True)
            else:
                impls.append(impl)
        if not impls:
            return
        print(f"[{pass_name} d={d} causal={int(causal)} s={seqlen} b={batch} h={heads}]", flush=True)
        try:
            sets = self.make_sets(batch, seqlen, heads, d, pass_name)
            refs = self.reference(sets[0], causal, batch, heads, pass_name)
        except Exception as e:  # noqa: BLE001
            for impl in impls:
                run.skip(impl, pass_name, d, seqlen, causal, f"inputs/reference failed: {short(e)}")
            self.cleanup()
            return
        fl = flops(batch, heads, seqlen, d, causal, pass_name)
        for impl in impls:
            t_start = time.perf_counter()
            try:
                if impl in ("fa4", "fa4-det"):
                    sup = self.fa4.supports(*sets[0][:3], backward=(pass_name == "bwd"), causal=causal,
                                            deterministic=impl == "fa4-det")
                    if not sup:
                        run.skip(impl, pass_name, d, seqlen, causal, f"unsupported: {sup.reason}")
                        continue
                with self.context(impl):
                    fwd = self.forward_fn(impl, causal, seqlen)
                    ok, err, msg = self.check(impl, fwd, sets[0], refs, causal, pass_name)
                    if not ok:
                        reason = f"WRONG OUTPUT at s={seqlen}: {msg}"
                        refused[impl] = reason
                        run.check_failures.append({"impl": impl, "pass": pass_name, "d": d, "seqlen": seqlen,
                                                   "causal": causal, "reason": msg})
                        print(f"  {impl:<11} REFUSED (not timed at d={d} causal={int(causal)}): {msg}", flush=True)
                        run.skip(impl, pass_name, d, seqlen, causal, reason, quiet=True)
                        continue
                    ms, reps = self.time_calls(self.timed_calls(impl, fwd, sets, pass_name))
            except Exception as e:  # noqa: BLE001 -- one impl/shape failing never aborts the run
                if os.environ.get("FA4_BENCH_TRACEBACK"):
                    traceback.print_exc()
                run.skip(impl, pass_name, d, seqlen, causal, short(e))
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize()
                continue
            finally:
                self.cleanup()
            tf = fl / (ms * 1e-3) / 1e12
            run.rows.append({"impl": impl, "dtype": a.dtype, "d": d, "seqlen": seqlen, "batch": batch,
                             "heads": heads, "causal": causal, "pass": pass_name, "tflops": round(tf, 2),
                             "ms": round(ms, 5), "reps": reps, "check_rel_err": float(f"{err:.3e}")})
            print(f"  {impl:<11} {tf:7.1f} TFLOP/s  {ms:9.4f} ms  (median of {reps}; check {err:.1e}; "
                  f"{time.perf_counter() - t_start:.1f} s incl. compile/check)", flush=True)
        del sets, refs
        self.cleanup()

    def cleanup(self):
        import gc
        gc.collect()
        with contextlib.suppress(Exception):
            self.torch.cuda.empty_cache()

    def meta(self):
        torch = self.torch
        m = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "sms": self.sms,
             "l2_bytes": self.l2}
        m.update(self.fa4_info)
        with contextlib.suppress(Exception):
            m["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        return m


# ------------------------------------------------------------------------------------------------ dry run

def dry_run(args, run):
    """Placeholder numbers shaped like the H200 peers, for testing the outputs only."""
    base = {"fa4": 600, "fa4-det": 560, "sdpa-cudnn": 560, "sdpa-flash": 320, "flex": 420}
    for pass_name in args.pass_list:
        for d in args.head_dims:
            for causal in args.causals:
                for seqlen in args.seqlens:
                    batch, heads = TOKENS // seqlen, args.hidden // d
                    for impl in args.impls:
                        if impl == "flex" and seqlen not in args.flex_seqlens:
                            run.skip(impl, pass_name, d, seqlen, causal, "not at this seqlen (--flex-seqlens)",
                                     quiet=True)
                            continue
                        if impl in ("fa4", "fa4-det") and pass_name == "bwd" and d not in (64, 128, 192, 256):
                            run.skip(impl, pass_name, d, seqlen, causal,
                                     f"unsupported: dry-run placeholder (no CUDA backward for head_dim {d})")
                            continue
                        if impl == "sdpa-flash" and d == 256 and causal:
                            run.skip(impl, pass_name, d, seqlen, causal, "RuntimeError: dry-run placeholder skip")
                            continue
                        tf = base[impl] * (1 - 0.25 * 512 / seqlen) * (0.8 if causal else 1.0) * (
                            0.7 if pass_name == "bwd" else 1.0) * (0.75 if d == 64 else 1.0)
                        ms = flops(batch, heads, seqlen, d, causal, pass_name) / (tf * 1e12) * 1e3
                        run.rows.append({"impl": impl, "dtype": args.dtype, "d": d, "seqlen": seqlen,
                                         "batch": batch, "heads": heads, "causal": causal, "pass": pass_name,
                                         "tflops": round(tf, 2), "ms": round(ms, 5), "reps": 0,
                                         "check_rel_err": 0.0})


# ------------------------------------------------------------------------------------------------ outputs

def markdown(doc, impls):
    rows = doc["rows"]
    skipped = doc.get("skipped", [])
    hidden = doc.get("hidden", HIDDEN)
    head = (f"GPU {doc['gpu']}, commit {doc['commit']}, {doc['date']}; {doc.get('dtype', 'bf16')}, 16k tokens "
            f"(b = 16384/s), hidden {hidden} (h = {hidden}/d); TFLOP/s, 4·b·h·s²·d (causal /2, backward ×2.5); median of "
            f"CUDA-event-timed calls over rotating inputs")
    if doc.get("torch"):
        head += f"; torch {doc['torch']}, cuDNN {doc.get('cudnn')}"
    lines = []
    if doc.get("dry_run"):
        lines += ["**DRY RUN: placeholder numbers, not measurements.**", ""]
    if doc.get("partial"):
        lines += ["**PARTIAL: written mid-run (checkpoint); the run did not finish.**", ""]
    lines += [head, ""]
    present = [i for i in impls if any(r["impl"] == i for r in rows) or
               any(s["impl"] == i for s in skipped)]
    groups = sorted({(r["pass"], r["d"], r["causal"]) for r in rows} |
                    {(s["pass"], s["d"], s["causal"]) for s in skipped},
                    key=lambda g: (g[0] != "fwd", g[1], g[2]))
    for pass_name, d, causal in groups:
        lines += [f"### {pass_name}, d={d}, {'causal' if causal else 'non-causal'}", ""]
        cols = ["seqlen", "b×h"] + [LABELS[i] for i in present] + ["fa4 / cuDNN"]
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        seqlens = sorted({r["seqlen"] for r in rows if (r["pass"], r["d"], r["causal"]) == (pass_name, d, causal)} |
                         {s["seqlen"] for s in skipped if (s["pass"], s["d"], s["causal"]) == (pass_name, d, causal)})
        for s in seqlens:
            got = {r["impl"]: r for r in rows if (r["pass"], r["d"], r["causal"], r["seqlen"]) ==
                   (pass_name, d, causal, s)}
            cells = [str(s), f"{TOKENS // s}×{hidden // d}"]
            for i in present:
                if i in got:
                    cells.append(f"{got[i]['tflops']:.0f}")
                else:
                    why = [k["reason"] for k in skipped if (k["impl"], k["pass"], k["d"], k["causal"], k["seqlen"])
                           == (i, pass_name, d, causal, s)]
                    cells.append("WRONG" if why and why[0].startswith(("WRONG", "refused: WRONG")) else "—")
            ratio = (got["fa4"]["tflops"] / got["sdpa-cudnn"]["tflops"]
                     if "fa4" in got and "sdpa-cudnn" in got and got["sdpa-cudnn"]["tflops"] > 0 else None)
            cells.append(f"{ratio:.2f}" if ratio is not None else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    notes = {}
    for k in skipped:
        if k["reason"].startswith("not at this seqlen"):
            continue
        key = (k["impl"], k["reason"])
        notes.setdefault(key, []).append(f"{k['pass']} d={k['d']} s={k['seqlen']}{' causal' if k['causal'] else ''}")
    if notes:
        lines += ["Not measured (— in the tables):", ""]
        for (impl, reason), where in notes.items():
            shown = ", ".join(where[:4]) + (f", … ({len(where)} shapes)" if len(where) > 4 else "")
            lines.append(f"- {impl}: {reason} [{shown}]")
        lines.append("")
    if any(k["reason"].startswith("not at this seqlen") for k in skipped):
        lines += ["FlexAttention runs only at the --flex-seqlens (its torch.compile is slow).", ""]
    return "\n".join(lines)


def plot(doc, impls, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = doc["rows"]
    dims = sorted({r["d"] for r in rows})
    causals = sorted({r["causal"] for r in rows})
    if not dims:
        return False
    fig, axes = plt.subplots(len(dims), len(causals), figsize=(6.0 * len(causals), 3.6 * len(dims)),
                             squeeze=False, sharex=True)
    colors = {"fa4": "tab:red", "fa4-det": "tab:orange", "sdpa-cudnn": "tab:blue", "sdpa-flash": "tab:green", "flex": "tab:purple"}
    for i, d in enumerate(dims):
        for j, causal in enumerate(causals):
            ax = axes[i][j]
            for impl in impls:
                for pass_name, style in (("fwd", "-"), ("bwd", "--")):
                    pts = sorted((r["seqlen"], r["tflops"]) for r in rows if (r["impl"], r["d"], r["causal"],
                                                                             r["pass"]) == (impl, d, causal, pass_name))
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=4,
                                color=colors.get(impl), label=f"{LABELS[impl]} {pass_name}")
            ax.set_xscale("log", base=2)
            xs = sorted({r["seqlen"] for r in rows})
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.minorticks_off()
            ax.set_title(f"d={d}, {'causal' if causal else 'non-causal'}")
            ax.set_ylabel("TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
            if i == len(dims) - 1:
                ax.set_xlabel("seqlen (16k tokens)")
    title = f"{doc['gpu']}, commit {doc['commit']}, {doc['date']}, {doc.get('dtype', 'bf16')}"
    if doc.get("hidden", HIDDEN) != HIDDEN:
        title += f", hidden {doc['hidden']}"
    if doc.get("dry_run"):
        title = "DRY RUN (placeholder numbers) — " + title
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_outputs(args, doc, with_plot=True):
    os.makedirs(args.out, exist_ok=True)
    stem = (f"{doc['date']}-{doc['commit']}" + (f"-hidden{args.hidden}" if args.hidden != HIDDEN else "") +
            ("-dry-run" if doc.get("dry_run") else ""))
    paths = {}
    if not with_plot:  # a checkpoint: JSON and markdown only
        doc = dict(doc, partial=True)
    for name in (f"{stem}.json", "latest.json"):
        p = os.path.join(args.out, name)
        with open(p, "w") as f:
            json.dump(doc, f, indent=1, default=str)  # paths and other non-JSON values as text
            f.write("\n")
        paths[name] = p
    md = markdown(doc, args.impls)
    p = os.path.join(args.out, f"{stem}.md")
    with open(p, "w") as f:
        f.write(md + "\n")
    paths["md"] = p
    if not with_plot:
        return md, paths
    try:
        p = os.path.join(args.out, f"{stem}.png")
        if plot(doc, args.impls, p):
            paths["png"] = p
    except Exception as e:  # noqa: BLE001 -- a missing matplotlib must not lose the numbers
        print(f"note: plot not written: {short(e)}", flush=True)
    return md, paths


def main(argv=None):
    args = parse_args(argv)
    commit = resolve_commit(args.commit)
    run = Run()
    t0 = time.time()
    doc = {"commit": commit, "gpu": None, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}

    def finish(final):
        doc.update({"dtype": args.dtype, "tokens": TOKENS, "hidden": args.hidden,
                    "timing": "CUDA events per call, median, after warm-up; inputs rotate over sets > 2x L2",
                    "flops": "4*b*h*s^2*d, causal /2, bwd x2.5 (backward alone)",
                    **({"bwd_timing": "torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) on a forward "
                                      "run once per input set outside the timing"}
                       if "bwd" in args.pass_list else {}),
                    "wall_s": round(time.time() - t0, 1),
                    "rows": run.rows, "skipped": run.skipped, "check_failures": run.check_failures})
        return write_outputs(args, doc, with_plot=final)
    if args.dry_run:
        print("gpu_bench: DRY RUN: placeholder numbers, for testing the output plumbing only", flush=True)
        doc["gpu"] = "dry-run (no GPU)"
        doc["dry_run"] = True
        dry_run(args, run)
    else:
        def on_term(signum, frame):
            raise KeyboardInterrupt
        with contextlib.suppress(Exception):
            signal.signal(signal.SIGTERM, on_term)  # `timeout` sends SIGTERM: still write what was measured
        gpu = Gpu(args)
        doc["gpu"] = gpu.gpu
        doc.update(gpu.meta())
        try:
            gpu.run(run, checkpoint=lambda: finish(False))
        except KeyboardInterrupt:
            print("interrupted: writing what was measured", flush=True)
    md, paths = finish(True)
    print("\nwrote " + ", ".join(paths.values()), flush=True)
    print("\n" + md, flush=True)
    return 2 if any(f["impl"] in ("fa4", "fa4-det") for f in run.check_failures) else 0


if __name__ == "__main__":
    sys.exit(main())
