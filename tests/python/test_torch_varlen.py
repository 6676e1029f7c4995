"""fa4.flash_attn_varlen_func on CPU tensors: ragged packed sequences (0 and 1 included, seqused_k) against the
fp64 oracle per sequence, autograd gradients against the oracle's, gradcheck, and bad arguments named."""

import numpy as np
import pytest

import fa4
import reference

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/python-deps installs it)")


@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (False, (9, 2), 15.0)])
def test_ragged_sequences_match_the_oracle(causal, window, softcap):
    lens_q, lens_k, unused = [7, 1, 0, 33, 4], [7, 6, 5, 40, 0], 2
    heads, heads_kv, dim = 4, 2, 16
    g = torch.Generator().manual_seed(3)
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum([n + unused for n in lens_k])]), dtype=torch.int32)
    used_k = torch.tensor(lens_k, dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), heads, dim, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.full((int(cu_k[-1]), heads_kv, dim), float("nan"), dtype=torch.float64)
    v = torch.full_like(k, float("nan"))
    for b, n in enumerate(lens_k):  # the unused rows stay NaN: reading one would poison the result
        k[cu_k[b]:cu_k[b] + n] = torch.randn(n, heads_kv, dim, generator=g, dtype=torch.float64)
        v[cu_k[b]:cu_k[b] + n] = torch.randn(n, heads_kv, dim, generator=g, dtype=torch.float64)
    k.requires_grad_(), v.requires_grad_()
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    out, lse = fa4.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), seqused_k=used_k,
                                          return_lse=True, **opts)
    assert out.shape == q.shape and lse.shape == (heads, q.shape[0])
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    ref_opts = reference.reference_options(opts)
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b]) + lens_k[b])
        args = [t[s].detach().unsqueeze(0).numpy() for t, s in ((q, qs), (k, ks), (v, ks))]
        ref_out, ref_lse = reference.attention(*args, **ref_opts)
        np.testing.assert_allclose(out[qs].detach().numpy(), ref_out[0], rtol=1e-10, atol=1e-10)
        finite = np.isfinite(ref_lse[0])
        np.testing.assert_allclose(lse[:, qs].numpy()[finite], ref_lse[0][finite], rtol=1e-6, atol=1e-6)  # fp32
        ref_grads = reference.attention_backward(*args, dout[qs].unsqueeze(0).numpy(), **ref_opts)
        for ours, ref in zip((dq[qs], dk[ks], dv[ks]), ref_grads):
            np.testing.assert_allclose(ours.numpy(), ref[0], rtol=1e-9, atol=1e-9)
        # The unused key rows get zero gradient (nothing read them).
        rest = slice(int(cu_k[b]) + lens_k[b], int(cu_k[b + 1]))
        assert torch.all(dk[rest] == 0) and torch.all(dv[rest] == 0)


def test_gradcheck():
    g = torch.Generator().manual_seed(5)
    cu_q = torch.tensor([0, 3, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32)
    q = torch.randn(5, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(9, 1, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(9, 1, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: fa4.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 5, causal=True),
                                    (q, k, v))


def test_bad_arguments_are_named():
    q = torch.randn(5, 2, 8, dtype=torch.float64)
    k = torch.randn(6, 2, 8, dtype=torch.float64)
    cu_q, cu_k = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0, 6], dtype=torch.int32)
    with pytest.raises(fa4.UnsupportedError, match="'dropout_p'"):
        fa4.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 5, 6, 0.1)
    with pytest.raises(fa4.InvalidArgumentError, match="'cu_seqlens_k': expected a contiguous 1-D int32"):
        fa4.flash_attn_varlen_func(q, k, k, cu_q, cu_k.long(), 5, 6)
    with pytest.raises(fa4.InvalidArgumentError, match="'varlen.max_seqlen_q'"):
        fa4.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 4, 6)
    with pytest.raises(fa4.InvalidArgumentError, match="'varlen.cu_seqlens_q\\[1\\]'"):
        fa4.flash_attn_varlen_func(q, k, k, torch.tensor([0, 6], dtype=torch.int32), cu_k, 6, 6)
    with pytest.raises(fa4.InvalidArgumentError, match="rank 3"):
        fa4.flash_attn_varlen_func(q[None], k, k, cu_q, cu_k, 5, 6)


def test_sinks_per_sequence_and_their_gradient_summed():
    """learnable_sink in a varlen batch: each sequence's out and lse are the dense call's with the same sinks, and
    dsink is the sum of the dense calls' (float64 inputs: computed exactly, summed in float32)."""
    lens = [5, 0, 9]
    heads, dim = 2, 8
    g = torch.Generator().manual_seed(7)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    q, k, v = (torch.randn(int(cu[-1]), heads, dim, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    sink = torch.tensor([0.8, -0.6], requires_grad=True)
    out, lse = fa4.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True,
                                          learnable_sink=sink)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (dsink,) = torch.autograd.grad(out, (sink,), dout)
    want = torch.zeros(heads)
    for b, n in enumerate(lens):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        if n == 0:
            continue
        s = sink.detach().clone().requires_grad_()
        o, l = fa4.flash_attn_func(*(t[rows].detach().unsqueeze(0) for t in (q, k, v)), causal=True,
                                   learnable_sink=s, return_lse=True)
        torch.testing.assert_close(out[rows].detach(), o[0], rtol=0, atol=0)
        torch.testing.assert_close(lse[:, rows], l[0], rtol=0, atol=0)
        (ds,) = torch.autograd.grad(o, (s,), dout[rows].unsqueeze(0))
        want += ds
    torch.testing.assert_close(dsink, want, rtol=1e-6, atol=1e-6)
    assert torch.all(dsink != 0)
