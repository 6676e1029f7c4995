"""fa4.flash_attn_with_kvcache on CPU tensors: paged (shuffled pages) and contiguous caches against the float64
oracle per sequence (its keys gathered from the pages), the in-place append of k/v, num_splits on every entry
point, opcheck of the custom op, and bad arguments named."""

import numpy as np
import pytest

import fa4
import reference

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/python-deps installs it)")

fa4.flash_attn_with_kvcache  # the first access registers torch.ops.fa4.*, which opcheck calls directly


def paged_cache(g, cached, seqlen_new, page_size, heads_kv, dim, dtype):
    """(k_cache, v_cache, page_table, keys, values): NaN-filled pages handed out in shuffled order, sequence b's
    first cached[b] keys written into its pages; keys/values[b] are all its keys (cached, then the new ones)."""
    batch = len(cached)
    max_pages = max((c + seqlen_new + page_size - 1) // page_size for c in cached) + 1
    num_pages = batch * max_pages + 2
    order = torch.randperm(num_pages, generator=g)[:batch * max_pages].to(torch.int32)
    page_table = order.reshape(batch, max_pages).contiguous()
    k_cache = torch.full((num_pages, page_size, heads_kv, dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    keys = [torch.randn(c + seqlen_new, heads_kv, dim, generator=g).to(dtype) for c in cached]
    values = [torch.randn(c + seqlen_new, heads_kv, dim, generator=g).to(dtype) for c in cached]
    for b, c in enumerate(cached):
        for j in range(c):
            page, row = page_table[b, j // page_size], j % page_size
            k_cache[page, row], v_cache[page, row] = keys[b][j], values[b][j]
    return k_cache, v_cache, page_table, keys, values


def check_against_oracle(q, out, lse, keys, values, dtype, opts):
    ref_opts = reference.reference_options(opts)
    for b in range(q.shape[0]):
        args = [t.unsqueeze(0).double().numpy() for t in (q[b], keys[b], values[b])]
        ref_out, ref_lse = reference.attention(*args, **ref_opts)
        if dtype == torch.float64:
            np.testing.assert_allclose(out[b].numpy(), ref_out[0], rtol=1e-10, atol=1e-10)
        else:
            naive, _ = reference.attention(*args, **ref_opts, rounding=reference.numpy_dtype(str(dtype).split(".")[1]))
            reference.assert_within_rule(out[b].float().double().numpy(), ref_out[0], naive[0],
                                         str(dtype).split(".")[1], softcap=opts.get("softcap", 0.0))
        finite = np.isfinite(ref_lse[0])
        np.testing.assert_allclose(lse[b].numpy()[finite], ref_lse[0][finite], rtol=1e-5, atol=1e-5)
        assert np.all(np.isneginf(lse[b].numpy()[~finite]))


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("opts", [dict(), dict(causal=True), dict(window_size=(20, 0), softcap=10.0),
                                  dict(causal=True, num_splits=3)], ids=["plain", "causal", "window_softcap", "splits"])
def test_paged_append_matches_the_oracle(page_size, opts):
    g = torch.Generator().manual_seed(page_size)
    dtype, heads, heads_kv, dim, seqlen_q, seqlen_new = torch.float32, 4, 2, 32, 3, 3
    cached = [0, 1, page_size, page_size - 2, 40]
    k_cache, v_cache, page_table, keys, values = paged_cache(g, cached, seqlen_new, page_size, heads_kv, dim, dtype)
    q = torch.randn(len(cached), seqlen_q, heads, dim, generator=g, dtype=dtype)
    k_new = torch.stack([k[c:] for k, c in zip(keys, cached)])
    v_new = torch.stack([v[c:] for v, c in zip(values, cached)])
    seqlens = torch.tensor(cached, dtype=torch.int32)
    out, lse = fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                           page_table=page_table, return_softmax_lse=True, **opts)
    assert out.shape == q.shape and lse.shape == (len(cached), heads, seqlen_q)
    check_against_oracle(q, out, lse, keys, values, dtype, opts)
    for b, c in enumerate(cached):  # the append landed in the pages, in place
        for j in range(c + seqlen_new):
            page, row = page_table[b, j // page_size], j % page_size
            assert torch.equal(k_cache[page, row], keys[b][j]) and torch.equal(v_cache[page, row], values[b][j])


def test_appended_keys_with_a_strided_head_dim():
    """k and v whose head_dim is not contiguous (every other element of a wider tensor) are copied before the
    call; the copies must live until the library has read them (a k copy freed early has its block reused, by v's
    copy or the allocator, so the appended keys read back wrong)."""
    g = torch.Generator().manual_seed(7)
    dtype, heads, heads_kv, dim, seqlen_new, page_size = torch.float32, 4, 2, 128, 200, 64
    cached = [5, 30]
    k_cache, v_cache, page_table, keys, values = paged_cache(g, cached, seqlen_new, page_size, heads_kv, dim, dtype)
    q = torch.randn(len(cached), 1, heads, dim, generator=g, dtype=dtype)
    wide_k, wide_v = (torch.zeros(len(cached), seqlen_new, heads_kv, 2 * dim, dtype=dtype) for _ in range(2))
    k_new, v_new = wide_k[..., ::2], wide_v[..., ::2]
    for b, c in enumerate(cached):
        k_new[b], v_new[b] = keys[b][c:], values[b][c:]
    assert k_new.stride(-1) == 2
    out, lse = fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=torch.tensor(
        cached, dtype=torch.int32), page_table=page_table, return_softmax_lse=True)
    check_against_oracle(q, out, lse, keys, values, dtype, {})


def test_eager_call_skips_the_op_and_still_bumps_the_caches_versions():
    """A plain eager call runs the op's body directly (host cost): the caches it appends to get their version
    counters bumped as the op's in-place bookkeeping would (autograd's saved-tensor checks rely on them), and a
    call without an append leaves them alone. Under torch.compile the op itself runs: same result."""
    g = torch.Generator().manual_seed(7)
    cached, seqlen_new, page_size = [5, 17], 1, 16
    k_cache, v_cache, page_table, keys, values = paged_cache(g, cached, seqlen_new, page_size, 1, 16, torch.float32)
    q = torch.randn(2, 1, 2, 16, generator=g)
    k_new = torch.stack([k[c:] for k, c in zip(keys, cached)])
    v_new = torch.stack([v[c:] for v, c in zip(values, cached)])
    seqlens = torch.tensor(cached, dtype=torch.int32)
    versions = (k_cache._version, v_cache._version)
    with torch.no_grad():
        out = fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                          page_table=page_table)
        assert k_cache._version > versions[0] and v_cache._version > versions[1]
        versions = (k_cache._version, v_cache._version)
        again = fa4.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens + 1, page_table=page_table)
        assert (k_cache._version, v_cache._version) == versions
        compiled = torch.compile(lambda *a: fa4.flash_attn_with_kvcache(*a, cache_seqlens=seqlens + 1,
                                                                        page_table=page_table), fullgraph=True)
        assert torch.equal(compiled(q, k_cache, v_cache), again)
    assert torch.allclose(out, again)


def test_contiguous_cache_and_block_table_alias():
    g = torch.Generator().manual_seed(1)
    batch, capacity, heads, heads_kv, dim = 3, 40, 2, 1, 16
    k_cache = torch.randn(batch, capacity, heads_kv, dim, generator=g, dtype=torch.float64)
    v_cache = torch.randn(batch, capacity, heads_kv, dim, generator=g, dtype=torch.float64)
    q = torch.randn(batch, 1, heads, dim, generator=g, dtype=torch.float64)
    k1, v1 = (torch.randn(batch, 1, heads_kv, dim, generator=g, dtype=torch.float64) for _ in range(2))
    seqlens = torch.tensor([0, 17, 39], dtype=torch.int32)
    out, lse = fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k1, v1, cache_seqlens=seqlens, causal=True,
                                           return_softmax_lse=True)
    keys = [k_cache[b, :int(seqlens[b]) + 1] for b in range(batch)]
    values = [v_cache[b, :int(seqlens[b]) + 1] for b in range(batch)]
    for b in range(batch):
        assert torch.equal(keys[b][-1], k1[b, 0]) and torch.equal(values[b][-1], v1[b, 0])
    check_against_oracle(q, out, lse, keys, values, torch.float64, dict(causal=True))
    # An int cache_seqlens means every sequence; None means full caches.
    full = fa4.flash_attn_with_kvcache(q, k_cache, v_cache)
    same = fa4.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=capacity)
    assert torch.equal(full, same)
    # block_table (FlashAttention 2's name) is page_table.
    k_pages, v_pages, table, pk, pv = paged_cache(g, [5, 30], 0, 16, heads_kv, dim, torch.float64)
    q2 = q[:2]
    a = fa4.flash_attn_with_kvcache(q2, k_pages, v_pages, cache_seqlens=torch.tensor([5, 30], dtype=torch.int32),
                                    block_table=table)
    b = fa4.flash_attn_with_kvcache(q2, k_pages, v_pages, cache_seqlens=torch.tensor([5, 30], dtype=torch.int32),
                                    page_table=table)
    assert torch.equal(a, b)


def test_num_splits_everywhere():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 5, 4, 32, generator=g)
    k, v = (torch.randn(2, 300, 2, 32, generator=g) for _ in range(2))
    base = fa4.flash_attn_func(q, k, v, causal=True)
    for n in (1, 2, 3, 8):
        torch.testing.assert_close(fa4.flash_attn_func(q, k, v, causal=True, num_splits=n), base, rtol=1e-5, atol=1e-5)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 300, 600], dtype=torch.int32)
    packed = fa4.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu_k, 5, 300,
                                        causal=True, num_splits=4)
    torch.testing.assert_close(packed, base.flatten(0, 1), rtol=1e-5, atol=1e-5)
    # The backward of a split forward is the unsplit one.
    qg = q.double().requires_grad_()
    kd, vd = k.double(), v.double()
    fa4.flash_attn_func(qg, kd, vd, num_splits=1).sum().backward()
    with pytest.raises(fa4.UnsupportedError, match="options.num_splits"):
        fa4.flash_attn_func(qg, kd, vd, num_splits=2)  # float64 is computed exactly: no fp32 partials
    with pytest.raises(fa4.InvalidArgumentError, match="options.num_splits"):
        fa4.flash_attn_func(q, k, v, num_splits=-1)
    qf = q.clone().requires_grad_()
    out = fa4.flash_attn_func(qf, k, v, num_splits=3)
    out.sum().backward()
    expected = q.clone().requires_grad_()
    fa4.flash_attn_func(expected, k, v).sum().backward()
    torch.testing.assert_close(qf.grad, expected.grad, rtol=1e-4, atol=1e-5)


def kvcache_args(dtype, append, paged):
    g = torch.Generator().manual_seed(9)
    heads, heads_kv, dim, batch = 4, 2, 16, 2
    q = torch.randn(batch, 2, heads, dim, generator=g).to(dtype)
    if paged:
        k_cache, v_cache = (torch.randn(6, 16, heads_kv, dim, generator=g).to(dtype) for _ in range(2))
        table = torch.tensor([[3, 0, 5], [1, 4, 2]], dtype=torch.int32)
    else:
        k_cache, v_cache = (torch.randn(batch, 40, heads_kv, dim, generator=g).to(dtype) for _ in range(2))
        table = None
    k_new, v_new = ((torch.randn(batch, 3, heads_kv, dim, generator=g).to(dtype) for _ in range(2)) if append
                    else (None, None))
    seqlens = torch.tensor([15, 30], dtype=torch.int32)
    return (q, k_cache, v_cache, k_new, v_new, seqlens, table, None, None, True, -1, -1, 0.0, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("append,paged", [(False, True), (True, True), (True, False)], ids=["paged", "paged_append",
                                                                                            "contiguous_append"])
def test_opcheck_kvcache(dtype, append, paged):
    torch.library.opcheck(torch.ops.fa4.forward_kvcache.default, kvcache_args(dtype, append, paged))


def test_bad_arguments_are_named():
    q, k_cache, v_cache, k_new, v_new, seqlens, table, *_ = kvcache_args(torch.float32, True, True)
    call = fa4.flash_attn_with_kvcache
    with pytest.raises(fa4.InvalidArgumentError, match="'block_table'"):
        call(q, k_cache, v_cache, page_table=table, block_table=table, cache_seqlens=seqlens)
    with pytest.raises(fa4.InvalidArgumentError, match="'v': expected a tensor"):
        call(q, k_cache, v_cache, k_new, None, cache_seqlens=seqlens, page_table=table)
    with pytest.raises(fa4.InvalidArgumentError, match="'cache_seqlens': expected a contiguous int32"):
        call(q, k_cache, v_cache, cache_seqlens=seqlens.long(), page_table=table)
    with pytest.raises(fa4.InvalidArgumentError, match="'page_table': expected a contiguous int32"):
        call(q, k_cache, v_cache, cache_seqlens=seqlens, page_table=table[:1])
    bad = table.clone()
    bad[1, 1] = 6
    with pytest.raises(fa4.InvalidArgumentError, match=r"'kvcache.page_table\[1\]\[1\]': expected a page index"):
        call(q, k_cache, v_cache, cache_seqlens=seqlens, page_table=bad)
    with pytest.raises(fa4.InvalidArgumentError, match=r"'kvcache.cache_seqlens\[1\]': expected at most 45"):
        call(q, k_cache, v_cache, k_new, v_new, cache_seqlens=torch.tensor([0, 46], dtype=torch.int32),
             page_table=table)
    with pytest.raises(fa4.InvalidArgumentError, match="positive multiple of 16"):
        call(q, k_cache[:, :8], v_cache[:, :8], cache_seqlens=seqlens, page_table=table)
    # Appended keys of another rank, a scalar included (it has no head_dim stride to test), and of a dtype fa4 has
    # no code for: named, not an IndexError.
    for bad_k in (k_new[0, 0, 0, 0], k_new[:, :, 0]):
        with pytest.raises(fa4.InvalidArgumentError, match="'kvcache.k_new': expected rank 4"):
            call(q, k_cache, v_cache, bad_k, v_new, cache_seqlens=seqlens, page_table=table)
    with pytest.raises(fa4.InvalidArgumentError, match="'k': expected dtype"):
        call(q, k_cache, v_cache, k_new.int(), v_new, cache_seqlens=seqlens, page_table=table)
    with pytest.raises(fa4.UnsupportedError, match="no backward"):
        call(q.clone().requires_grad_(), k_cache, v_cache, cache_seqlens=seqlens, page_table=table)
    with torch.no_grad():
        call(q.clone().requires_grad_(), k_cache, v_cache, cache_seqlens=seqlens, page_table=table)
