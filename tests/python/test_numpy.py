"""fa4.attention / fa4.attention_backward on numpy arrays (CPU backend) against the float64 reference."""

import os
import subprocess
import sys

import numpy as np
import pytest

import fa4
import reference

DTYPES = ["float64", "float32", "float16", "bfloat16"]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("name,shape,options", reference.CASES, ids=[c[0] for c in reference.CASES])
def test_values_within_tolerance_rule(rng, dtype_name, name, shape, options):
    if dtype_name == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="bfloat16 arrays need ml_dtypes")
    dtype = reference.numpy_dtype(dtype_name)
    q, k, v = reference.random_inputs(rng, dtype=dtype, **shape)
    out, lse = fa4.attention(q, k, v, return_lse=True, **options)
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == np.float32

    ref_options = reference.reference_options(options)
    ref_out, ref_lse = reference.attention(q, k, v, **ref_options)
    naive_out, _ = reference.attention(q, k, v, rounding=dtype, **ref_options)
    reference.assert_within_rule(out, ref_out, naive_out, dtype, softcap=options.get("softcap", 0.0))
    # LSE: float32 from the (rounded) inputs; -inf exactly where a row is fully masked.
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name,shape,options", reference.CASES, ids=[c[0] for c in reference.CASES])
def test_reference_backward_matches_the_float64_backend(rng, name, shape, options):
    """The oracle's gradients (reference.attention_backward, which the GPU tests also use) against the CPU
    backend's float64 backward: both exact, independently written (the backend's is checked against central
    differences below)."""
    q, k, v = reference.random_inputs(rng, **shape)
    dout = rng.standard_normal(q.shape)
    out, lse = fa4.attention(q, k, v, return_lse=True, **options)
    grads = fa4.attention_backward(dout, q, k, v, out, lse, **options)
    ref = reference.attention_backward(q, k, v, dout, **reference.reference_options(options))
    reference.assert_gradients_within_rule(grads, ref, ref, np.float64)


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name,shape,options", reference.CASES, ids=[c[0] for c in reference.CASES])
def test_backward_within_tolerance_rule(rng, dtype_name, name, shape, options):
    """Low-precision gradients of the CPU backend against the oracle, with the naive same-precision baseline
    of reference.attention_backward(rounding=...): the rule the CUDA gradient tests apply."""
    if dtype_name == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="bfloat16 arrays need ml_dtypes")
    dtype = reference.numpy_dtype(dtype_name)
    q, k, v = reference.random_inputs(rng, dtype=dtype, **shape)
    dout = rng.standard_normal(q.shape).astype(dtype)
    out, lse = fa4.attention(q, k, v, return_lse=True, **options)
    grads = fa4.attention_backward(dout, q, k, v, out, lse, **options)
    assert all(g.dtype == dtype for g in grads)
    ref_options = reference.reference_options(options)
    ref = reference.attention_backward(q, k, v, dout, **ref_options)
    naive = reference.attention_backward(q, k, v, dout, rounding=dtype, **ref_options)
    reference.assert_gradients_within_rule(grads, ref, naive, dtype, softcap=options.get("softcap", 0.0))


def test_fully_masked_rows_give_zero_and_minus_inf(rng):
    # causal with seqlen_q > seqlen_k: rows i < seqlen_q - seqlen_k see no key at all.
    q, k, v = reference.random_inputs(rng, 1, 6, 2, 2, 2, 8, dtype=np.float32)
    out, lse = fa4.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :4] == 0) and np.all(np.isneginf(lse[:, :, :4]))
    assert np.all(np.isfinite(out[:, 4:])) and np.all(np.isfinite(lse[:, :, 4:]))
    dq, dk, dv = fa4.attention_backward(np.ones_like(out), q, k, v, out, lse, causal=True)
    assert all(np.all(np.isfinite(g)) for g in (dq, dk, dv))
    assert np.all(dq[:, :4] == 0)


def test_empty_keys(rng):
    q, k, v = reference.random_inputs(rng, 1, 3, 0, 2, 2, 8, dtype=np.float32)
    out, lse = fa4.attention(q, k, v, return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_default_scale_is_inverse_sqrt_head_dim(rng):
    q, k, v = reference.random_inputs(rng, 1, 5, 7, 2, 2, 16)
    np.testing.assert_array_equal(fa4.attention(q, k, v), fa4.attention(q, k, v, softmax_scale=0.25))


def test_window_none_means_unbounded(rng):
    q, k, v = reference.random_inputs(rng, 1, 5, 7, 2, 2, 16)
    np.testing.assert_array_equal(fa4.attention(q, k, v, window_size=(None, 2)),
                                  fa4.attention(q, k, v, window_size=(-1, 2)))


def test_bhsd_storage_through_strides(rng):
    # [b, h, s, d] arrays viewed as [b, s, h, d]: no copy needed, same result as contiguous BSHD.
    q_bhsd, k_bhsd, v_bhsd = (rng.standard_normal((2, 3, n, 16)) for n in (9, 11, 11))
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q_bhsd, k_bhsd, v_bhsd))
    assert not q.flags.c_contiguous
    expected = fa4.attention(*(np.ascontiguousarray(x) for x in (q, k, v)), causal=True)
    np.testing.assert_allclose(fa4.attention(q, k, v, causal=True), expected, rtol=1e-13, atol=1e-13)


def test_non_unit_head_dim_stride_is_copied(rng):
    q, k, v = reference.random_inputs(rng, 1, 4, 6, 2, 2, 16)
    every_other = [np.repeat(x, 2, axis=3)[..., ::2] for x in (q, k, v)]
    assert every_other[0].strides[3] != every_other[0].itemsize
    np.testing.assert_allclose(fa4.attention(*every_other), fa4.attention(q, k, v), rtol=1e-13, atol=1e-13)


def test_big_endian_input(rng):
    q, k, v = reference.random_inputs(rng, 1, 4, 6, 2, 2, 16, dtype=np.float32)
    swapped = [x.astype(x.dtype.newbyteorder(">")) for x in (q, k, v)]
    np.testing.assert_array_equal(fa4.attention(*swapped), fa4.attention(q, k, v))


@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(window_size=(2, 1), softcap=3.0),
                                     dict(causal=True, softmax_scale=0.7)],
                         ids=["plain", "causal", "window_softcap", "causal_scale"])
def test_backward_matches_central_differences(rng, options):
    # float64 is computed exactly, so the gradients of L = sum(out * dout) match central differences closely.
    q, k, v = reference.random_inputs(rng, 1, 4, 5, 2, 1, 4)
    dout = rng.standard_normal(q.shape)
    out, lse = fa4.attention(q, k, v, return_lse=True, **options)
    grads = fa4.attention_backward(dout, q, k, v, out, lse, **options)

    def loss(q_, k_, v_):
        return float(np.sum(fa4.attention(q_, k_, v_, **options) * dout))

    step = 1e-6
    inputs = [q, k, v]
    for which, grad in enumerate(grads):
        numeric = np.zeros_like(grad)
        for index in np.ndindex(grad.shape):
            plus = [x.copy() for x in inputs]
            minus = [x.copy() for x in inputs]
            plus[which][index] += step
            minus[which][index] -= step
            numeric[index] = (loss(*plus) - loss(*minus)) / (2 * step)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8, err_msg=("dq", "dk", "dv")[which])


def test_backward_gqa_sums_over_query_heads(rng):
    # dk/dv of a shared kv head = the sum over the query heads that read it (compare with repeated kv).
    q, k, v = reference.random_inputs(rng, 2, 6, 9, 4, 2, 8)
    dout = rng.standard_normal(q.shape)
    out, lse = fa4.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = fa4.attention_backward(dout, q, k, v, out, lse, causal=True)
    k_rep, v_rep = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
    out_rep, lse_rep = fa4.attention(q, k_rep, v_rep, causal=True, return_lse=True)
    dq_rep, dk_rep, dv_rep = fa4.attention_backward(dout, q, k_rep, v_rep, out_rep, lse_rep, causal=True)
    np.testing.assert_allclose(dq, dq_rep, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dk, dk_rep.reshape(2, 9, 2, 2, 8).sum(axis=3), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dv, dv_rep.reshape(2, 9, 2, 2, 8).sum(axis=3), rtol=1e-12, atol=1e-12)


def test_deterministic_backward_is_bitwise_repeatable(rng):
    q, k, v = reference.random_inputs(rng, 2, 33, 47, 4, 2, 32, dtype=np.float32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, lse = fa4.attention(q, k, v, return_lse=True)
    first = fa4.attention_backward(dout, q, k, v, out, lse, deterministic=True)
    second = fa4.attention_backward(dout, q, k, v, out, lse, deterministic=True)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


def test_numpy_use_does_not_import_torch():
    code = ("import sys, numpy as np, fa4\n"
            "x = np.ones((1, 2, 1, 4), np.float32)\n"
            "fa4.attention(x, x, x)\n"
            "assert 'torch' not in sys.modules, 'fa4 imported torch'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
