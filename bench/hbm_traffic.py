#!/usr/bin/env python3
"""HBM bytes of one attention forward, measured: DRAM bytes read and written by every kernel of one call,
summed (Nsight Compute's dram__bytes_read.sum / dram__bytes_write.sum, L2 flushed before each kernel), for fa4
beside SDPA's math backend (the unfused Q·Kᵀ → softmax → P·V that FlashAttention replaces) and SDPA cuDNN, on the
same shape, with the formulas beside them (issue 13's guide, docs/learn/04-hbm-traffic.md).

  PYTHONPATH=python FA4_LIBRARY=build-sm90/libfa4.so python3 bench/hbm_traffic.py [--json out.json]
      [-b 1 --heads 16 -s 4096 -d 128] [--impls fa4,sdpa-math,sdpa-cudnn] [--commit SHA]

Each implementation runs in its own process under ncu (`--profile-from-start off`): a warm-up call, then one
call between cudaProfilerStart and cudaProfilerStop, so only that call's kernels are counted.
"""
import argparse
import csv
import io
import json
import os
import subprocess
import sys

METRICS = "dram__bytes_read.sum,dram__bytes_write.sum"


def one_call(impl, b, h, s, d):
    """The child: one warm-up call and one profiled call of impl."""
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    if impl == "fa4":
        import fa4
        call = lambda: fa4.flash_attn_func(q, k, v)  # noqa: E731
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"sdpa-math": SDPBackend.MATH, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}[impl]
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def measure(impl, a):
    cmd = ["ncu", "--profile-from-start", "off", "--metrics", METRICS, "--csv", "--print-units", "base",
           sys.executable, os.path.abspath(__file__), "--child", impl, "-b", str(a.batch), "--heads", str(a.heads),
           "-s", str(a.seqlen), "-d", str(a.head_dim)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"ncu failed for {impl} (rc {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    text = "\n".join(line for line in out.stdout.splitlines() if line.startswith('"'))
    read = write = 0.0
    kernels = set()
    for row in csv.DictReader(io.StringIO(text)):
        value = float(row["Metric Value"].replace(",", ""))
        kernels.add((row["ID"], row["Kernel Name"]))
        if row["Metric Name"] == "dram__bytes_read.sum":
            read += value
        elif row["Metric Name"] == "dram__bytes_write.sum":
            write += value
    if not kernels:
        raise SystemExit(f"ncu profiled no kernel for {impl}:\n{out.stdout[-2000:]}")
    return {"impl": impl, "kernels": len(kernels), "kernel_names": sorted({k[1][:80] for k in kernels}),
            "dram_read_mb": read / 1e6, "dram_write_mb": write / 1e6, "dram_mb": (read + write) / 1e6}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", "--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("-s", "--seqlen", type=int, default=4096)
    ap.add_argument("-d", "--head-dim", type=int, default=128)
    ap.add_argument("--impls", default="fa4,sdpa-math,sdpa-cudnn")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    for name in ("batch", "heads", "seqlen", "head_dim"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(a, name)}")
    if a.child:
        one_call(a.child, a.batch, a.heads, a.seqlen, a.head_dim)
        return
    b, h, s, d = a.batch, a.heads, a.seqlen, a.head_dim
    # bf16: Q, K, V read once and O written once (the fused kernel's floor; its LSE adds 4 bytes a row);
    # the unfused path also writes S = Q·Kᵀ, reads it for the softmax, writes P and reads P for P·V.
    io_mb = 4 * b * h * s * d * 2 / 1e6
    scores_mb = b * h * s * s * 2 / 1e6
    print(f"shape: b={b} heads={h} s={s} d={d} bf16; Q,K,V,O once: {io_mb:.1f} MB; one s x s score matrix: "
          f"{scores_mb:.1f} MB")
    rows = []
    for impl in a.impls.split(","):
        r = measure(impl, a)
        r.update(batch=b, heads=h, seqlen=s, d=d, dtype="bf16", commit=a.commit,
                 formula_io_mb=io_mb, formula_scores_mb=scores_mb)
        rows.append(r)
        print(f"{impl:11s} kernels {r['kernels']:2d}  DRAM read {r['dram_read_mb']:9.1f} MB  write "
              f"{r['dram_write_mb']:9.1f} MB  total {r['dram_mb']:9.1f} MB  = {r['dram_mb'] / io_mb:6.2f} x Q,K,V,O "
              f"= {r['dram_mb'] / scores_mb:5.2f} x one score matrix")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
