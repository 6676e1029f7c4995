"""The float64 oracle for the Python tests (numpy, independent of libfa4) and FlashAttention's tolerance rule.

Semantics (DESIGN.md §3): BSHD; GQA (query head h reads kv head h // (heads_q // heads_kv)); scores
s = scale·q·kᵀ, then softcap·tanh(s/softcap); causal bottom-right (row i sees keys j <= i + seqlen_k - seqlen_q),
window (left, right) around that diagonal, -1 = unbounded; a fully masked row gives out = 0, lse = -inf."""

import numpy as np


def allowed_keys(seqlen_q, seqlen_k, causal=False, window=(-1, -1)):
    """[seqlen_q, seqlen_k] bool: which keys each query row attends to."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    diagonal = i + seqlen_k - seqlen_q
    mask = np.ones((seqlen_q, seqlen_k), bool)
    if left >= 0:
        mask &= j >= diagonal - left
    if right >= 0:
        mask &= j <= diagonal + right
    return mask


def attention(q, k, v, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, rounding=None):
    """(out [b, s_q, h, d], lse [b, h, s_q]) in float64: the oracle.

    With `rounding` (a numpy dtype) it is instead the 'naive attention in the same precision' of the tolerance
    rule: float32 computes every step in float32; float16/bfloat16 round every intermediate (scores,
    probabilities, output) to that dtype, as a framework's low-precision matmuls with float32 accumulation do."""
    work = np.float32 if rounding is not None and np.dtype(rounding) == np.float32 else np.float64

    def rounded(x):
        return x if rounding is None or work == np.float32 else x.astype(rounding).astype(np.float64)

    q, k, v = (np.asarray(x).astype(work) for x in (q, k, v))
    heads_q, heads_kv, head_dim = q.shape[2], k.shape[2], q.shape[3]
    k = np.repeat(k, heads_q // heads_kv, axis=2)
    v = np.repeat(v, heads_q // heads_kv, axis=2)
    # fa4_options carries the scale and softcap as float32: the reference uses the same float32 values.
    scale = work(np.float32(1.0 / np.sqrt(np.float32(head_dim)) if softmax_scale is None else softmax_scale))
    s = rounded(np.einsum("bqhd,bkhd->bhqk", q, k) * scale)
    if softcap:
        softcap = work(np.float32(softcap))
        s = rounded(softcap * np.tanh(s / softcap))
    s = np.where(allowed_keys(q.shape[1], k.shape[1], causal, window), s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)
    finite_max = np.where(np.isfinite(row_max), row_max, 0.0).astype(work)
    row_sum = np.exp(s - finite_max).sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.log(row_sum) + finite_max  # -inf where the row is fully masked (row_sum = 0)
    p = rounded(np.where(row_sum > 0, np.exp(s - np.where(np.isfinite(lse), lse, 0.0)), 0.0).astype(work))
    out = rounded(np.einsum("bhqk,bkhd->bqhd", p, v))
    return out.astype(np.float64), lse[..., 0].astype(np.float64)


def attention_backward(q, k, v, dout, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0,
                       rounding=None):
    """(dq, dk, dv) in float64: the oracle's gradients of attention(q, k, v, ...) for the output gradient dout.

    With `rounding` (a numpy dtype) they are instead the tolerance rule's naive same-precision baseline, as
    src/cpu/reference.cpp's Precision::storage computes it: float32 work for float32; for float16/bfloat16 the
    products S = q·kᵀ, P, dP = dO·vᵀ, dS and the gradients are rounded to that dtype (dK, dV once, after the sum
    over the query heads of a GQA group). D = rowsum(P ∘ dP) (= rowsum(dO ∘ O) in exact arithmetic)."""
    work = np.float32 if rounding is not None and np.dtype(rounding) == np.float32 else np.float64

    def rounded(x):
        return x if rounding is None or work == np.float32 else x.astype(rounding).astype(np.float64)

    q, k, v, dout = (np.asarray(x).astype(work) for x in (q, k, v, dout))
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    # [b, h, s, d], kv repeated per query head (query head h reads kv head h // group): batched matmuls.
    qh, doh = (x.transpose(0, 2, 1, 3) for x in (q, dout))
    kh, vh = (np.repeat(x, group, axis=2).transpose(0, 2, 1, 3) for x in (k, v))
    scale = work(np.float32(1.0 / np.sqrt(np.float32(head_dim)) if softmax_scale is None else softmax_scale))
    s = rounded(qh @ kh.transpose(0, 1, 3, 2)) * scale
    t = np.zeros_like(s)
    if softcap:
        softcap = work(np.float32(softcap))
        t = np.tanh(s / softcap)
        s = softcap * t
    s = np.where(allowed_keys(seqlen_q, seqlen_k, causal, window), s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(s - np.where(np.isfinite(row_max), row_max, 0.0).astype(work))  # 0 where masked
    row_sum = e.sum(axis=-1, keepdims=True)
    p = rounded(e / np.where(row_sum > 0, row_sum, 1.0).astype(work))  # fully masked rows: P = 0
    dp = rounded(doh @ vh.transpose(0, 1, 3, 2))
    dsum = (p * dp).sum(axis=-1, keepdims=True)
    ds = rounded(p * (dp - dsum) * (1 - t * t)) * scale
    dq = rounded(ds @ kh).transpose(0, 2, 1, 3)

    def per_kv_head(x):  # [b, h_q, s_k, d] -> [b, s_k, h_kv, d], summed over each group
        return rounded(x.reshape(batch, heads_kv, group, seqlen_k, head_dim).sum(axis=2).transpose(0, 2, 1, 3))
    dk = per_kv_head(ds.transpose(0, 1, 3, 2) @ qh)
    dv = per_kv_head(p.transpose(0, 1, 3, 2) @ doh)
    return tuple(np.ascontiguousarray(g, dtype=np.float64) for g in (dq, dk, dv))


def numpy_dtype(name):
    """A numpy dtype by name; bfloat16 comes from ml_dtypes (callers skip when it is not installed)."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def tolerance_atol(reference_out, dtype):
    """FlashAttention's atol: twice the rounding error of ref + 0.3 - 0.3 in the compared dtype."""
    x = reference_out.astype(dtype)
    y = ((x.astype(np.float64) + 0.3).astype(dtype).astype(np.float64) - 0.3).astype(dtype)
    return 2 * float(np.max(np.abs(y.astype(np.float64) - x.astype(np.float64)), initial=0.0))


def rule_factor(dtype, softcap=0.0):
    """The rule's factor on the naive error: FlashAttention's 2 (3 with softcap) for fp16/bf16, whose naive error
    is dominated by low-precision rounding. In float32 the naive baseline accumulates in float32 just as fa4 does,
    so both errors are a few ulps and their ratio is noise-limited (measured 1-4x on CASES): 4 there."""
    factor = 4.0 if np.dtype(dtype) == np.float32 else 2.0
    return factor * 1.5 if softcap else factor


def gradient_atol(reference_grad, dtype, softcap=0.0):
    """What the rule adds for gradients (src/testing/tolerance.cpp): FlashAttention's 3e-4 with softcap; in
    float32 4 ulp of max|ref| (the flash backward takes D = dO·O from the stored output, the naive baseline sums
    P·dP: the cancellation in dP - D costs a few ulps that the baseline does not pay)."""
    extra = 3e-4 if softcap else 0.0
    if np.dtype(dtype) == np.float32:
        extra += 4 * 2.0**-23 * float(np.max(np.abs(reference_grad), initial=0.0))
    return extra


def assert_within_rule(ours, reference_out, naive_out, dtype, softcap=0.0, extra_atol=0.0, name="out"):
    """max|ours - ref| <= rule_factor·max|naive - ref| + atol (+ extra_atol) (FlashAttention's rule). float64 is
    computed exactly, so it is held to 1e-10 instead. A NaN anywhere in ours fails."""
    ours = np.asarray(ours).astype(np.float64)
    assert ours.shape == reference_out.shape, f"{name}: shape {ours.shape}, expected {reference_out.shape}"
    assert not np.isnan(ours).any(), f"{name}: {int(np.isnan(ours).sum())} NaN elements (an unwritten output?)"
    error = float(np.max(np.abs(ours - reference_out), initial=0.0))
    if np.dtype(dtype) == np.float64:
        bound = 1e-10 * max(1.0, float(np.max(np.abs(reference_out), initial=0.0)))
    else:
        naive_error = float(np.max(np.abs(naive_out - reference_out), initial=0.0))
        bound = rule_factor(dtype, softcap) * naive_error + tolerance_atol(reference_out, dtype) + extra_atol
    assert error <= bound, (f"{name}: max |ours - reference| = {error:.3g} > bound {bound:.3g} "
                            f"({np.dtype(dtype).name})")
    return error


def assert_gradients_within_rule(grads, reference_grads, naive_grads, dtype, softcap=0.0):
    """The rule on each of (dq, dk, dv), with the gradients' extra atol."""
    for name, ours, ref, naive in zip(("dq", "dk", "dv"), grads, reference_grads, naive_grads):
        assert_within_rule(ours, ref, naive, dtype, softcap, gradient_atol(ref, dtype, softcap), name)


def random_inputs(rng, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype=np.float64):
    """q, k, v drawn from N(0, 1), rounded to dtype."""
    def draw(seqlen, heads):
        return rng.standard_normal((batch, seqlen, heads, head_dim)).astype(dtype)
    return draw(seqlen_q, heads_q), draw(seqlen_k, heads_kv), draw(seqlen_k, heads_kv)


# Shapes and options shared by the numpy and torch value tests: (name, shape kwargs, option kwargs).
CASES = [
    ("mha", dict(batch=2, seqlen_q=17, seqlen_k=17, heads_q=3, heads_kv=3, head_dim=32), {}),
    ("causal_sq<sk", dict(batch=1, seqlen_q=13, seqlen_k=40, heads_q=4, heads_kv=4, head_dim=64), dict(causal=True)),
    ("causal_sq>sk_masked_rows", dict(batch=2, seqlen_q=23, seqlen_k=9, heads_q=2, heads_kv=1, head_dim=16),
     dict(causal=True)),
    ("gqa_window", dict(batch=1, seqlen_q=113, seqlen_k=203, heads_q=8, heads_kv=2, head_dim=64),
     dict(window_size=(31, 7))),
    ("mqa_decode", dict(batch=3, seqlen_q=1, seqlen_k=239, heads_q=4, heads_kv=1, head_dim=128), dict(causal=True)),
    ("softcap_scale", dict(batch=1, seqlen_q=33, seqlen_k=65, heads_q=2, heads_kv=2, head_dim=96),
     dict(softcap=5.0, softmax_scale=0.3)),
    ("head_dim_256", dict(batch=1, seqlen_q=8, seqlen_k=16, heads_q=1, heads_kv=1, head_dim=256), {}),
]


def reference_options(options):
    """The reference's keyword arguments for an options dict of the public API."""
    return dict(softmax_scale=options.get("softmax_scale"), causal=options.get("causal", False),
                window=tuple(options.get("window_size", (-1, -1))), softcap=options.get("softcap", 0.0))
