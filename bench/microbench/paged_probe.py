#!/usr/bin/env python3
"""Two rounds of one paged-prefill shape through flash_attn_with_kvcache, contiguous cache then 64-row pages in a
random order (paged_prefill_bench.py's first shape), and nothing else: the launches a profiler compares
(perf-log F21). Under ncu, `--kernel-name regex:fwd_kernel --launch-skip 2 --launch-count 2` takes the second
round's contiguous and paged kernels.

  PYTHONPATH=python FA4_LIBRARY=build-sm90/libfa4.so ncu ... python3 bench/microbench/paged_probe.py [B SK SQ]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import fa4  # noqa: E402

batch, sk, sq = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (1, 16384, 2048)
heads, heads_kv, d, page = 32, 8, 128, 64
gen = torch.Generator(device="cuda").manual_seed(1)
q = torch.randn(batch, sq, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
k = torch.randn(batch, sk, heads_kv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
v = torch.randn_like(k)
pages = batch * sk // page
order = torch.randperm(pages, device="cuda", generator=gen)
k_pages = torch.empty(pages, page, heads_kv, d, device="cuda", dtype=torch.bfloat16)
v_pages = torch.empty_like(k_pages)
k_pages[order], v_pages[order] = k.view(pages, page, heads_kv, d), v.view(pages, page, heads_kv, d)
table = order.to(torch.int32).view(batch, sk // page)
lens = torch.full((batch,), sk, dtype=torch.int32, device="cuda")
with torch.no_grad():
    for _ in range(2):
        fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)
        fa4.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lens, page_table=table, causal=True)
torch.cuda.synchronize()
print(f"paged_probe: b={batch} s_k={sk} s_q={sq}: two rounds of contiguous + paged (64) done")
