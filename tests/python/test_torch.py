"""fa4.flash_attn_func and the fa4::forward / fa4::backward custom ops on CPU tensors: values, autograd
(gradcheck in float64), opcheck, torch.compile(fullgraph=True)."""

import numpy as np
import pytest

import fa4
import reference

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/python-deps installs it)")
fa4.flash_attn_func  # the first access registers torch.ops.fa4.*, which the opcheck tests call directly

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def to_numpy_float64(t):
    return t.detach().to(torch.float64).numpy()


def random_tensors(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype=torch.float64,
                   requires_grad=False, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def draw(seqlen, heads):
        x = torch.randn(batch, seqlen, heads, head_dim, generator=generator, dtype=torch.float64).to(dtype)
        return x.requires_grad_(requires_grad)
    return draw(seqlen_q, heads_q), draw(seqlen_k, heads_kv), draw(seqlen_k, heads_kv)


@pytest.mark.parametrize("dtype_name", list(TORCH_DTYPES))
@pytest.mark.parametrize("name,shape,options", reference.CASES, ids=[c[0] for c in reference.CASES])
def test_values_within_tolerance_rule(dtype_name, name, shape, options):
    if dtype_name == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    dtype = TORCH_DTYPES[dtype_name]
    q, k, v = random_tensors(dtype=dtype, **shape)
    out, lse = fa4.flash_attn_func(q, k, v, return_lse=True, **options)
    assert out.dtype == dtype and out.shape == q.shape and out.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])

    ref_out, ref_lse = reference.attention(*(to_numpy_float64(t) for t in (q, k, v)),
                                           **reference.reference_options(options))
    reference.assert_within_rule(to_numpy_float64(out), ref_out, naive_torch_attention(q, k, v, **options),
                                 reference.numpy_dtype(dtype_name), softcap=options.get("softcap", 0.0))
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(lse.numpy()), ~finite)
    np.testing.assert_allclose(lse.numpy()[finite], ref_lse[finite], rtol=2e-5, atol=2e-5)


def naive_torch_attention(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0):
    """Attention in q's precision with torch ops (the tolerance rule's 'naive' term), as float64 numpy."""
    group = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    scale = float(np.float32(q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    allowed = torch.from_numpy(reference.allowed_keys(q.shape[1], k.shape[1], causal, window_size))
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return to_numpy_float64(torch.einsum("bhqk,bkhd->bqhd", p, v))


def test_bhsd_tensors_through_strides():
    q, k, v = (torch.randn(2, 3, n, 16, dtype=torch.float64).transpose(1, 2) for n in (9, 11, 11))
    expected = fa4.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    torch.testing.assert_close(fa4.flash_attn_func(q, k, v, causal=True), expected, rtol=1e-13, atol=1e-13)


def test_lse_is_not_differentiable():
    q, k, v = random_tensors(1, 4, 6, 2, 2, 8, requires_grad=True)
    out, lse = fa4.flash_attn_func(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


def test_plain_call_matches_the_custom_op():
    # Without gradients or tracing, flash_attn_func skips the op's dispatch: same bits as through the op (which a
    # requires_grad input still takes, and which then records the backward).
    q, k, v = random_tensors(2, 5, 7, 4, 2, 8, dtype=torch.float32, seed=3)
    sink = torch.tensor([0.5, -1.0, 2.0, -3.0])
    with torch.no_grad():
        out, lse = fa4.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_lse=True)
        out_only = fa4.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    op_out, op_lse = torch.ops.fa4.forward(q, k, v, sink, None, True, -1, -1, 0.0, False, 0)
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse) and torch.equal(out_only, op_out)
    qg = q.clone().requires_grad_(True)
    out_grad = fa4.flash_attn_func(qg, k, v, causal=True, learnable_sink=sink)
    assert out_grad.grad_fn is not None and torch.equal(out_grad.detach(), op_out)  # the op path: autograd recorded
    # Meta tensors and a dispatch mode take the op too (its fake kernel answers shapes; the mode sees the op).
    with torch.no_grad():
        meta = fa4.flash_attn_func(*(t.to("meta") for t in (q, k, v)))
        assert meta.device.type == "meta" and meta.shape == q.shape
        from torch.utils._python_dispatch import TorchDispatchMode

        class Recorder(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(str(func))
                return func(*args, **(kwargs or {}))

        with Recorder() as seen:
            fa4.flash_attn_func(q, k, v)
        assert any("fa4.forward" in op for op in seen.ops), seen.ops


GRADCHECK_CASES = [
    ("mha", dict(batch=1, seqlen_q=3, seqlen_k=4, heads_q=2, heads_kv=2, head_dim=4), {}),
    ("causal_sq<sk", dict(batch=2, seqlen_q=3, seqlen_k=5, heads_q=1, heads_kv=1, head_dim=4), dict(causal=True)),
    ("causal_masked_rows", dict(batch=1, seqlen_q=5, seqlen_k=3, heads_q=2, heads_kv=1, head_dim=4),
     dict(causal=True)),
    ("gqa_window", dict(batch=1, seqlen_q=6, seqlen_k=7, heads_q=4, heads_kv=2, head_dim=3),
     dict(window_size=(2, 1))),
    ("softcap_scale", dict(batch=1, seqlen_q=4, seqlen_k=4, heads_q=2, heads_kv=2, head_dim=8),
     dict(softcap=2.0, softmax_scale=0.9)),
    ("mqa_decode", dict(batch=2, seqlen_q=1, seqlen_k=6, heads_q=3, heads_kv=1, head_dim=4), dict(causal=True)),
]


@pytest.mark.parametrize("name,shape,options", GRADCHECK_CASES, ids=[c[0] for c in GRADCHECK_CASES])
def test_gradcheck_float64(name, shape, options):
    inputs = random_tensors(requires_grad=True, seed=1, **shape)
    assert torch.autograd.gradcheck(lambda q, k, v: fa4.flash_attn_func(q, k, v, **options), inputs)


def test_float32_gradients_match_float64():
    q, k, v = random_tensors(2, 37, 29, 4, 2, 32, dtype=torch.float32, requires_grad=True)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    dout = torch.randn(q.shape, dtype=torch.float64)
    fa4.flash_attn_func(q, k, v, causal=True).backward(dout.float())
    fa4.flash_attn_func(q64, k64, v64, causal=True).backward(dout)
    for low, high in ((q, q64), (k, k64), (v, v64)):
        torch.testing.assert_close(low.grad.double(), high.grad, rtol=1e-4, atol=1e-4)


def test_deterministic_backward_is_bitwise_repeatable():
    q, k, v = random_tensors(2, 33, 47, 4, 2, 32, dtype=torch.float32, requires_grad=True)
    dout = torch.randn(q.shape)
    grads = []
    for _ in range(2):
        out = fa4.flash_attn_func(q, k, v, deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), dout))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def forward_args(dtype, requires_grad=False, **options):
    q, k, v = random_tensors(2, 7, 9, 4, 2, 16, dtype=dtype, requires_grad=requires_grad)
    window = options.get("window_size", (-1, -1))
    sink = options.get("learnable_sink")
    return (q, k, v, sink, options.get("softmax_scale"), options.get("causal", False), window[0], window[1],
            options.get("softcap", 0.0), False)


OPCHECK_OPTIONS = [dict(), dict(causal=True, softcap=4.0), dict(window_size=(3, 2), softmax_scale=0.5),
                   dict(causal=True, learnable_sink=torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("options", OPCHECK_OPTIONS, ids=["plain", "causal_softcap", "window_scale", "sinks"])
def test_opcheck_forward(dtype, options):
    torch.library.opcheck(torch.ops.fa4.forward.default, forward_args(dtype, requires_grad=True, **options))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
def test_opcheck_backward(dtype, sinks):
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0]) if sinks else None
    q, k, v, *options = forward_args(dtype, causal=True, learnable_sink=sink)
    out, lse = torch.ops.fa4.forward(q, k, v, *options)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.fa4.backward.default, (dout, q, k, v, out, lse, *options))


def attention_block(q, k, v):
    """A small model step around the op, so the compiled graph has neighbours to fuse."""
    out = fa4.flash_attn_func(q * 1.5, k, v, causal=True, window_size=(8, 0), softcap=10.0)
    return out.relu().sum(dim=-1)


@pytest.mark.parametrize("backend,dynamic", [pytest.param("aot_eager", True, id="aot_eager_dynamic"),
                                             pytest.param("inductor", False, id="inductor", marks=pytest.mark.slow)])
def test_torch_compile_fullgraph_forward_and_backward(backend, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(attention_block, backend=backend, fullgraph=True, dynamic=dynamic)
    for seqlen_q, seqlen_k in ((5, 9), (6, 11)):  # a second shape: recompiles or runs the dynamic graph
        inputs = random_tensors(2, seqlen_q, seqlen_k, 4, 2, 16, dtype=torch.float32, requires_grad=True)
        eager_inputs = [t.detach().clone().requires_grad_() for t in inputs]
        compiled(*inputs).sum().backward()
        attention_block(*eager_inputs).sum().backward()
        for ours, eager in zip(inputs, eager_inputs):
            torch.testing.assert_close(ours.grad, eager.grad, rtol=1e-5, atol=1e-5)


def test_torch_compile_sees_no_graph_break():
    torch._dynamo.reset()
    q, k, v = random_tensors(1, 5, 5, 2, 2, 8, dtype=torch.float32)
    explanation = torch._dynamo.explain(attention_block)(q, k, v)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


def zeros(q_shape=(1, 4, 2, 8), kv_shape=(1, 6, 2, 8), dtype=torch.float32):
    return torch.zeros(q_shape, dtype=dtype), torch.zeros(kv_shape, dtype=dtype), torch.zeros(kv_shape, dtype=dtype)


def test_bad_tensors_name_the_argument(expect_error):
    q, k, v = zeros()
    expect_error(fa4.InvalidArgumentError, "k", fa4.flash_attn_func, *zeros(kv_shape=(1, 6, 2, 4)))
    expect_error(fa4.InvalidArgumentError, "q", fa4.flash_attn_func, *zeros(dtype=torch.int32))
    expect_error(fa4.InvalidArgumentError, "q", fa4.flash_attn_func, q[0], k, v)
    expect_error(fa4.InvalidArgumentError, "v", fa4.flash_attn_func, q, k, np.zeros((1, 6, 2, 8)))
    expect_error(fa4.UnsupportedError, "q", fa4.flash_attn_func, *zeros((1, 4, 2, 512), (1, 6, 2, 512)))


def test_bad_options_name_their_field(expect_error):
    expect_error(fa4.InvalidArgumentError, "options.window_right", fa4.flash_attn_func, *zeros(), causal=True,
                 window_size=(-1, 3))
    expect_error(fa4.InvalidArgumentError, "window_size", fa4.flash_attn_func, *zeros(), window_size=(1, 2, 3))
    expect_error(fa4.InvalidArgumentError, "options.softcap", fa4.flash_attn_func, *zeros(), softcap=-2.0)


def test_error_inside_torch_compile_keeps_its_class():
    torch._dynamo.reset()
    compiled = torch.compile(fa4.flash_attn_func, backend="aot_eager", fullgraph=True)
    with pytest.raises(fa4.InvalidArgumentError, match="'k'"):
        compiled(*zeros(q_shape=(1, 4, 3, 8)))


def sink_attention(q, k, v, sink, causal=False):
    """Attention with sinks from the definition, in float64: the sink is one more logit per head in the softmax
    whose value row is zero (q: [b, s_q, h, d]; k, v: [b, s_k, h_kv, d]; sink: [h])."""
    q, k, v, sink = (t.double() for t in (q, k, v, sink))
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        rows = torch.arange(sq)[:, None] + (sk - sq)
        s = s.masked_fill(torch.arange(sk)[None, :] > rows, float("-inf"))
    logits = torch.cat([s, sink[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)], dim=-1)
    # A row that sees no key and has a sink of -inf has nothing in its softmax: out 0, lse -inf, zero gradients
    # (torch.softmax would give NaN there), so the softmax is spelled out with a guarded max and denominator.
    m = logits.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(logits - m)
    l = e.sum(dim=-1, keepdim=True)
    p = (e / torch.where(l == 0, torch.ones_like(l), l))[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", p, v), (m + torch.log(l)).squeeze(-1)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sinks_forward_and_lse_match_the_definition(causal):
    q, k, v = random_tensors(2, 19, 13, 4, 2, 16, dtype=torch.float32)  # causal: rows 0..5 see no key
    sink = torch.tensor([0.3, 4.0, -2.0, 1.0])
    out, lse = fa4.flash_attn_func(q, k, v, causal=causal, learnable_sink=sink, return_lse=True)
    want_out, want_lse = sink_attention(q, k, v, sink, causal)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)


def test_sinks_gradcheck_float64():
    q, k, v = random_tensors(1, 6, 5, 2, 1, 8, dtype=torch.float64, requires_grad=True)
    sink = torch.tensor([0.7, -0.4], dtype=torch.float32, requires_grad=True)  # the library takes float32 sinks

    def f(q, k, v, sink):
        return fa4.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)

    # q, k, v in float64 against finite differences; the float32 sink's gradient against the definition's
    torch.autograd.gradcheck(lambda q, k, v: f(q, k, v, sink.detach()), (q, k, v))
    dout = torch.randn(q.shape, dtype=torch.float64)
    (dsink,) = torch.autograd.grad(f(q, k, v, sink), (sink,), dout)
    s64 = sink.detach().double().requires_grad_()
    want_out, _ = sink_attention(q.detach(), k.detach(), v.detach(), s64, causal=True)
    (want,) = torch.autograd.grad(want_out, (s64,), dout)
    assert dsink.dtype == torch.float32
    torch.testing.assert_close(dsink.double(), want, rtol=1e-5, atol=1e-6)


def test_sinks_bad_argument_is_named():
    q, k, v = random_tensors(1, 4, 4, 2, 2, 8, dtype=torch.float32)
    with pytest.raises(fa4.InvalidArgumentError, match="learnable_sink"):
        fa4.flash_attn_func(q, k, v, learnable_sink=torch.zeros(2, dtype=torch.bfloat16))
    with pytest.raises(fa4.InvalidArgumentError, match="options.sinks': expected shape \\[2\\]"):
        fa4.flash_attn_func(q, k, v, learnable_sink=torch.zeros(3))
