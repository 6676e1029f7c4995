"""fa4 on CUDA tensors: forward values, SDPA comparison, gradients (autograd through fa4::forward / fa4::backward)
against the float64 oracle, opcheck, torch.compile, CUDA-graph capture and replay of forward and backward, the
deterministic option, and the per-call overhead of a decode-sized call.

Every test here is marked `gpu`. Without a GPU they skip with that reason; on a GPU whose libfa4 cannot run a
pass (fa4_supports answers FA4_ERROR_UNSUPPORTED: no CUDA kernels, no CUDA backward, or not for this dtype,
head_dim or option) they skip with the library's reason, except the tests that check that such a refusal reaches
the caller as fa4.UnsupportedError. Nothing in the Python package refuses a CUDA call itself: only the library."""

import time
import zlib

import numpy as np
import pytest

import fa4
import reference

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/python-deps installs it)")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU (torch.cuda.is_available() "
                                                                       "is False)")]

LOW_PRECISION = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def cuda_tensors(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype=torch.bfloat16, seed=0,
                 requires_grad=False, q_std=1.0):
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def draw(seqlen, heads, std=1.0):
        x = (torch.randn(batch, seqlen, heads, head_dim, generator=generator, device="cuda") * std).to(dtype)
        return x.requires_grad_(requires_grad)
    return draw(seqlen_q, heads_q, q_std), draw(seqlen_k, heads_kv), draw(seqlen_k, heads_kv)


def cuda_randn_like(t, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(t.shape, generator=generator, device="cuda").to(t.dtype)


def case_seed(*parts):
    """A seed of its own for each case (fresh inputs per case, reproducible from the test id)."""
    return zlib.crc32("/".join(map(str, parts)).encode())


def library_support(dtype=torch.bfloat16, backward=False, head_dim=128, **options):
    return fa4.supports(*cuda_tensors(1, 128, 128, 2, 2, head_dim, dtype=dtype), backward=backward, **options)


def require_kernels(dtype=torch.bfloat16, backward=False, head_dim=128, **options):
    """Skip, with the library's own reason, when it cannot run this pass on CUDA tensors of this dtype and head
    dim with these options (for the backward: the forward too, which autograd runs first)."""
    for pass_backward in ((False, True) if backward else (False,)):
        support = library_support(dtype, pass_backward, head_dim, **options)
        if not support:
            pytest.skip(f"libfa4 cannot run the {'backward' if pass_backward else 'forward'} pass on CUDA {dtype} "
                        f"head_dim {head_dim}: {support.reason}")


def poison_cached_blocks(*like, copies=3):
    """Best effort at the C++ tests' NaN-poisoned outputs: the ops take their outputs (and gradients) from torch's
    caching allocator, so fill blocks of those sizes with NaN and hand them back to the cache, where the next
    allocations of those sizes on this stream find them. A gradient element the kernel leaves unwritten then
    fails the comparison instead of reading as a fresh segment's zeros."""
    blocks = [torch.full(t.shape, float("nan"), dtype=t.dtype, device=t.device) for t in like for _ in range(copies)]
    del blocks


def assert_gradients_match_reference(gradient_sets, q, k, v, dout, dtype_name, options):
    """Each (dq, dk, dv) in gradient_sets against the float64 oracle under FlashAttention's rule (the naive
    same-precision baseline of reference.attention_backward; 3e-4 more with softcap)."""
    arrays = [to_numpy_float64(t) for t in (q, k, v, dout)]
    ref_options = reference.reference_options(options)
    dtype = reference.numpy_dtype(dtype_name)
    ref = reference.attention_backward(*arrays, **ref_options)
    naive = reference.attention_backward(*arrays, rounding=dtype, **ref_options)
    for grads in gradient_sets:
        for g, x in zip(grads, (q, k, v)):
            assert g.dtype == q.dtype and g.shape == x.shape and g.device == x.device, (g.dtype, g.shape, g.device)
        reference.assert_gradients_within_rule([to_numpy_float64(g) for g in grads], ref, naive, dtype,
                                               softcap=options.get("softcap", 0.0))


def assert_same_computation(ours, theirs):
    """Two runs of the same kernels on the same inputs: out bitwise (the forward is deterministic); gradients
    within a few ulps (the non-deterministic backward adds dQ partials in any order)."""
    out, *grads = ours
    their_out, *their_grads = theirs
    assert torch.equal(out, their_out)
    for name, a, b in zip(("dq", "dk", "dv"), grads, their_grads):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3, msg=lambda m: f"{name}: {m}")


def to_numpy_float64(t):
    return t.detach().double().cpu().numpy()


def test_unsupported_cuda_call_raises_the_library_reason():
    support = library_support()
    if support:
        pytest.skip("libfa4 has CUDA kernels for this call")
    q, k, v = cuda_tensors(1, 128, 128, 2, 2, 128)
    with pytest.raises(fa4.UnsupportedError) as info:
        fa4.flash_attn_func(q, k, v)
    assert "'q'" in str(info.value) and "cuda" in str(info.value)


@pytest.mark.parametrize("dtype_name", list(LOW_PRECISION))
@pytest.mark.parametrize("name,shape,options", reference.CASES, ids=[c[0] for c in reference.CASES])
def test_values_within_tolerance_rule(dtype_name, name, shape, options):
    pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    dtype = LOW_PRECISION[dtype_name]
    require_kernels(dtype)
    # The GPU kernels are compiled for head dims 64, 128 and 256: run each CPU case at the next one up.
    shape = dict(shape, head_dim=next(d for d in (64, 128, 256) if d >= shape["head_dim"]))
    q, k, v = cuda_tensors(dtype=dtype, **shape)
    out, lse = fa4.flash_attn_func(q, k, v, return_lse=True, **options)
    ref_out, ref_lse = reference.attention(*(to_numpy_float64(t) for t in (q, k, v)),
                                           **reference.reference_options(options))
    naive_out = naive_attention(q, k, v, **options)
    reference.assert_within_rule(to_numpy_float64(out), ref_out, naive_out, reference.numpy_dtype(dtype_name),
                                 softcap=options.get("softcap", 0.0))
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(lse.cpu().numpy()), ~finite)
    np.testing.assert_allclose(lse.cpu().numpy()[finite], ref_lse[finite], rtol=1e-4, atol=1e-4)


def naive_attention(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0):
    """Attention in q's precision with torch ops on the GPU (the rule's naive term), as float64 numpy."""
    group = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    scale = float(np.float32(q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    allowed = torch.from_numpy(reference.allowed_keys(q.shape[1], k.shape[1], causal, window_size)).cuda()
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return to_numpy_float64(torch.einsum("bhqk,bkhd->bqhd", p, v))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
def test_matches_sdpa_under_tolerance_rule(dtype_name, causal):
    """Reference: SDPA in float32 (math backend) on the inputs; naive: SDPA in the inputs' precision. seqlen_q ==
    seqlen_k, so SDPA's top-left causal is fa4's bottom-right one."""
    pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    dtype = torch.float32 if dtype_name == "float32" else torch.bfloat16
    require_kernels(dtype)
    q, k, v = cuda_tensors(2, 512, 512, 8, 8, 128, dtype=dtype)
    out = fa4.flash_attn_func(q, k, v, causal=causal)

    def sdpa(q_, k_, v_):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            bhsd = [x.transpose(1, 2) for x in (q_, k_, v_)]
            return torch.nn.functional.scaled_dot_product_attention(*bhsd, is_causal=causal).transpose(1, 2)
    reference_out = to_numpy_float64(sdpa(*(x.float() for x in (q, k, v))))
    naive_out = to_numpy_float64(sdpa(q, k, v))
    reference.assert_within_rule(to_numpy_float64(out), reference_out, naive_out, reference.numpy_dtype(dtype_name))


def test_opcheck_on_cuda():
    require_kernels(torch.bfloat16, backward=True)
    q, k, v = cuda_tensors(2, 64, 96, 4, 2, 128, requires_grad=True)
    torch.library.opcheck(torch.ops.fa4.forward.default, (q, k, v, None, None, True, -1, -1, 0.0, False))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sinks_on_cuda_forward_and_gradients_match_the_definition(causal):
    """learnable_sink on CUDA tensors: out, lse, dq, dk, dv and dsink against the float64 definition of attention
    with a sink (one more logit per head whose value row is zero), on the bfloat16 inputs. Causal with more queries
    than keys leaves rows that see no key (out 0, lse = the sink). Bounds: a few bfloat16 roundoffs of the output
    scale (the C++ GPU tests apply the tolerance rule; here the definition is torch's)."""
    from test_torch import sink_attention
    require_kernels(torch.bfloat16, backward=True)
    q, k, v = cuda_tensors(2, 200, 150, 4, 2, 128, seed=5, requires_grad=True)
    sink = torch.tensor([0.3, 4.0, -2.0, float("-inf")], device="cuda", requires_grad=True)
    out, lse = fa4.flash_attn_func(q, k, v, causal=causal, learnable_sink=sink, return_lse=True)
    dout = cuda_randn_like(q, 6)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    qd, kd, vd, sd = (t.detach().cpu().double().requires_grad_() for t in (q, k, v, sink))
    want_out, want_lse = sink_attention(qd, kd, vd, sd, causal)
    want = torch.autograd.grad(want_out, (qd, kd, vd, sd), dout.cpu().double())
    torch.testing.assert_close(out.cpu().double(), want_out.detach(), rtol=0, atol=2e-2)
    torch.testing.assert_close(lse.cpu().double(), want_lse.detach(), rtol=1e-4, atol=1e-4)
    for name, g, w in zip(("dq", "dk", "dv", "dsink"), grads, want):
        scale = w.abs().max().item()
        torch.testing.assert_close(g.cpu().double(), w, rtol=0, atol=3e-2 * max(scale, 1e-3),
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert grads[3].dtype == torch.float32 and torch.isfinite(grads[3]).all()


def attention_block(q, k, v):
    return fa4.flash_attn_func(q * 1.5, k, v, causal=True).float().relu().sum(dim=-1)


GRAD_CASES = [  # (name, shape without head_dim, options): several tiles of both kernels' block sizes, ragged edges
    ("mha", dict(batch=2, seqlen_q=256, seqlen_k=256, heads_q=4, heads_kv=4), {}),
    ("mha_causal", dict(batch=2, seqlen_q=256, seqlen_k=256, heads_q=4, heads_kv=4), dict(causal=True)),
    ("gqa_sq<sk", dict(batch=1, seqlen_q=200, seqlen_k=333, heads_q=8, heads_kv=2), {}),
    ("gqa_causal_sq<sk", dict(batch=2, seqlen_q=113, seqlen_k=301, heads_q=6, heads_kv=2), dict(causal=True)),
    ("gqa_sq>sk", dict(batch=2, seqlen_q=257, seqlen_k=64, heads_q=4, heads_kv=2), {}),
    ("mqa_causal_sq>sk_masked_rows", dict(batch=1, seqlen_q=300, seqlen_k=129, heads_q=4, heads_kv=1),
     dict(causal=True)),
    ("mqa_decode", dict(batch=3, seqlen_q=1, seqlen_k=257, heads_q=4, heads_kv=1), dict(causal=True)),
    ("gqa_causal_long", dict(batch=1, seqlen_q=1024, seqlen_k=1024, heads_q=4, heads_kv=2), dict(causal=True)),
    ("gqa_window_softcap_scale", dict(batch=1, seqlen_q=190, seqlen_k=250, heads_q=4, heads_kv=2),
     dict(window_size=(40, 7), softcap=5.0, softmax_scale=0.5)),
]


def gradient_inputs(shape, head_dim, dtype, options, seed):
    """q, k, v (requiring grad) and dout, fresh per seed; with a softcap q is scaled by softcap/4 (as
    FlashAttention's tests and fa4's C++ tests do) so that the scores reach the cap."""
    softcap = options.get("softcap", 0.0)
    q, k, v = cuda_tensors(head_dim=head_dim, dtype=dtype, seed=seed, requires_grad=True,
                           q_std=softcap / 4 if softcap else 1.0, **shape)
    return q, k, v, cuda_randn_like(q, seed + 1)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype_name", list(LOW_PRECISION))
@pytest.mark.parametrize("name,shape,options", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradients_within_tolerance_rule(dtype_name, head_dim, name, shape, options):
    """Autograd through fa4::forward and fa4::backward on CUDA tensors, against the float64 oracle."""
    pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    dtype = LOW_PRECISION[dtype_name]
    require_kernels(dtype, backward=True, head_dim=head_dim, **options)
    q, k, v, dout = gradient_inputs(shape, head_dim, dtype, options, case_seed(name, dtype_name, head_dim))
    poison_cached_blocks(q, k, v)
    out = fa4.flash_attn_func(q, k, v, **options)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_gradients_match_reference([grads], q, k, v, dout, dtype_name, options)


def test_backward_uses_a_torch_workspace_on_the_current_stream(monkeypatch):
    """The backward's workspace comes from torch's caching allocator on q's device, and the launch goes on the
    current stream of the backward, which autograd makes the forward's (here a side stream)."""
    pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    require_kernels(torch.bfloat16, backward=True)
    calls = []
    real_backward = fa4._capi.backward

    def spy(*args):
        calls.append(args[-3:])  # workspace pointer, workspace bytes, stream
        return real_backward(*args)
    monkeypatch.setattr(fa4._capi, "backward", spy)

    q, k, v, dout = gradient_inputs(dict(batch=2, seqlen_q=256, seqlen_k=320, heads_q=8, heads_kv=2), 128,
                                    torch.bfloat16, {}, case_seed("workspace"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fa4.flash_attn_func(q, k, v, causal=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.current_stream().wait_stream(side)

    assert len(calls) == 1, calls
    workspace, workspace_bytes, stream = calls[0]
    assert stream == side.cuda_stream
    assert workspace_bytes > 0 and workspace is not None, "the CUDA backward asks for a workspace; none was passed"
    segments = [s for s in torch.cuda.memory_snapshot()
                if s["address"] <= workspace and workspace + workspace_bytes <= s["address"] + s["total_size"]]
    assert segments, "the workspace is not in a segment of torch's caching allocator"
    assert segments[0]["device"] == q.device.index
    assert segments[0].get("stream", side.cuda_stream) == side.cuda_stream
    assert_gradients_match_reference([grads], q, k, v, dout, "bfloat16", dict(causal=True))


@pytest.mark.parametrize("layout", ["broadcast_seqlen", "misaligned_view", "bhsd", "autograd_sum_over_seqlen"])
def test_backward_takes_any_dout_layout(layout):
    """dout's layout is autograd's choice (out.sum(dim=1) hands back a seqlen stride of 0; a slice of a larger
    gradient can start anywhere): the op gives the kernels a copy they can read instead of failing."""
    pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    require_kernels(torch.bfloat16, backward=True)
    q, k, v, _ = gradient_inputs(dict(batch=2, seqlen_q=160, seqlen_k=224, heads_q=4, heads_kv=2), 128,
                                 torch.bfloat16, {}, case_seed("dout", layout))
    b, s, h, d = q.shape
    generator = torch.Generator(device="cuda").manual_seed(case_seed("dout values", layout))

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda").to(q.dtype)
    if layout == "autograd_sum_over_seqlen":
        weight = randn(b, h, d)
        out = fa4.flash_attn_func(q, k, v, causal=True)
        grads = torch.autograd.grad((out.sum(dim=1) * weight).sum(), (q, k, v))
        dout = weight[:, None].expand(b, s, h, d)
    else:
        dout = {"broadcast_seqlen": lambda: randn(b, 1, h, d).expand(b, s, h, d),
                "misaligned_view": lambda: randn(q.numel() + 1)[1:].view(q.shape),
                "bhsd": lambda: randn(b, h, s, d).transpose(1, 2)}[layout]()
        q_, k_, v_ = (t.detach() for t in (q, k, v))
        out, lse = torch.ops.fa4.forward(q_, k_, v_, None, None, True, -1, -1, 0.0, False)
        grads = torch.ops.fa4.backward(dout, q_, k_, v_, out, lse, None, None, True, -1, -1, 0.0, False)
    assert_gradients_match_reference([grads], q, k, v, dout, "bfloat16", dict(causal=True))


def test_backward_refusal_reaches_the_caller_through_autograd():
    """A head dim the CUDA forward has and the CUDA backward has not: the library's fa4.UnsupportedError,
    naming the argument, comes out of autograd with its class and message. Since the backward covers every
    forward head dim (64/128/192/256) this runs only against a library built without some backward row."""
    require_kernels(torch.bfloat16, head_dim=256)
    support = library_support(torch.bfloat16, backward=True, head_dim=256)
    if support:
        pytest.skip("libfa4 has a CUDA backward at head_dim 256: nothing to refuse")
    q, k, v = cuda_tensors(1, 128, 128, 2, 2, 256, requires_grad=True)
    out = fa4.flash_attn_func(q, k, v)
    with pytest.raises(fa4.UnsupportedError) as info:
        out.backward(torch.ones_like(out))
    assert "'q'" in str(info.value) and "cuda" in str(info.value), str(info.value)


def test_backward_opcheck_on_cuda():
    require_kernels(torch.bfloat16, backward=True)
    q, k, v = cuda_tensors(2, 64, 96, 4, 2, 128, seed=case_seed("backward opcheck"))
    options = (None, None, True, -1, -1, 0.0, False)  # learnable_sink, softmax_scale, causal, window, softcap, det
    out, lse = torch.ops.fa4.forward(q, k, v, *options)
    dout = cuda_randn_like(out, 5)
    torch.library.opcheck(torch.ops.fa4.backward.default, (dout, q, k, v, out, lse, *options))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_torch_compile_fullgraph_forward_and_backward_on_cuda(causal):
    """torch.compile(fullgraph=True) (Inductor) of a step around the op, differentiated: the same numbers as eager
    fa4, and within the rule of the oracle."""
    pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    require_kernels(torch.bfloat16, backward=True)
    torch._dynamo.reset()

    def step(q, k, v, dout):  # d loss / d out = dout exactly (dout is bfloat16, its float() exact)
        out = fa4.flash_attn_func(q, k, v, causal=causal)
        return out, (out.float() * dout.float()).sum()
    compiled = torch.compile(step, fullgraph=True)
    options = dict(causal=causal)
    q, k, v, dout = gradient_inputs(dict(batch=2, seqlen_q=200, seqlen_k=328, heads_q=8, heads_kv=2), 128,
                                    torch.bfloat16, options, case_seed("compile", causal))
    eager_inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, loss = compiled(q, k, v, dout)
    grads = torch.autograd.grad(loss, (q, k, v))
    eager_out, eager_loss = step(*eager_inputs, dout)
    eager_grads = torch.autograd.grad(eager_loss, eager_inputs)
    assert_same_computation((out, *grads), (eager_out, *eager_grads))
    assert_gradients_match_reference([grads, eager_grads], q, k, v, dout, "bfloat16", options)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name,head_dim", [("bfloat16", 128), ("float16", 64)])
def test_cuda_graph_capture_and_replay_forward_and_backward(dtype_name, head_dim, causal):
    """Forward and backward captured in one CUDA graph (static inputs, warm-up on a side stream as PyTorch's
    docs do), replayed with new values copied into the inputs: the gradients follow, within the rule."""
    pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    dtype = LOW_PRECISION[dtype_name]
    require_kernels(dtype, backward=True, head_dim=head_dim)
    options = dict(causal=causal)
    shape = dict(batch=2, seqlen_q=190, seqlen_k=300, heads_q=8, heads_kv=2)
    q, k, v, dout = gradient_inputs(shape, head_dim, dtype, options, case_seed("graph", dtype_name, causal))

    def step():
        out = fa4.flash_attn_func(q, k, v, **options)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    for replay in range(3):
        new_q, new_k, new_v, new_dout = gradient_inputs(shape, head_dim, dtype, options,
                                                        case_seed("graph replay", dtype_name, causal, replay))
        with torch.no_grad():
            for static, new in ((q, new_q), (k, new_k), (v, new_v), (dout, new_dout)):
                static.copy_(new)
        graph.replay()
        assert_gradients_match_reference([captured[1:]], q, k, v, dout, dtype_name, options)
        assert_same_computation(captured, step())


def test_deterministic_backward_on_cuda_is_refused_or_bitwise_repeatable():
    """deterministic=True reaches the library, and exactly two outcomes pass: it refuses with fa4.UnsupportedError
    whose message names 'deterministic' (and fa4.supports says the same), or it runs, and then 20 forward+backward
    runs give bitwise identical gradients, within the rule of the oracle. GQA and several key blocks per query
    row, so that an order-dependent dQ or dK/dV sum would show."""
    pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    require_kernels(torch.bfloat16, backward=True)  # the (non-deterministic) CUDA backward exists
    options = dict(causal=True)
    q, k, v, dout = gradient_inputs(dict(batch=2, seqlen_q=600, seqlen_k=640, heads_q=4, heads_kv=1), 128,
                                    torch.bfloat16, options, case_seed("deterministic"))
    support = fa4.supports(q, k, v, backward=True, deterministic=True, **options)
    runs = []
    try:
        for _ in range(20):
            out = fa4.flash_attn_func(q, k, v, deterministic=True, **options)
            runs.append(torch.autograd.grad(out, (q, k, v), dout))
    except fa4.UnsupportedError as e:
        assert not runs, f"refused after {len(runs)} runs that it accepted: {e}"
        assert "deterministic" in str(e), str(e)
        assert not support and "deterministic" in support.reason, support
        return
    assert support, f"the deterministic backward ran, but fa4.supports said: {support.reason}"
    assert_gradients_match_reference(runs[:1], q, k, v, dout, "bfloat16", options)
    for run, grads in enumerate(runs[1:], start=2):
        for name, first, again in zip(("dq", "dk", "dv"), runs[0], grads):
            assert torch.equal(first, again), f"{name} of run {run} differs bitwise from run 1"


def test_forward_opcheck_on_cuda():
    """The forward alone (inputs without grad), so it runs wherever the CUDA forward does."""
    require_kernels(torch.bfloat16)
    q, k, v = cuda_tensors(2, 64, 96, 4, 2, 128)
    for causal in (False, True):
        torch.library.opcheck(torch.ops.fa4.forward.default, (q, k, v, None, None, causal, -1, -1, 0.0, False))


def test_forward_torch_compile_fullgraph_on_cuda():
    require_kernels(torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(attention_block, fullgraph=True)
    inputs = cuda_tensors(2, 128, 256, 8, 2, 128)
    torch.testing.assert_close(compiled(*inputs), attention_block(*inputs), rtol=1e-5, atol=1e-5)  # sum order


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_cuda_graph_capture_and_replay(causal):
    """Causal calls allocate their tile counter stream-ordered: the capture must record it and replays reuse it."""
    require_kernels(torch.bfloat16)
    q, k, v = cuda_tensors(2, 300, 700, 8, 2, 128)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fa4.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fa4.flash_attn_func(q, k, v, causal=causal)
    for seed in (1, 2, 3):
        new_q, new_k, new_v = cuda_tensors(2, 300, 700, 8, 2, 128, seed=seed)
        q.copy_(new_q), k.copy_(new_k), v.copy_(new_v)
        graph.replay()
        torch.testing.assert_close(captured, fa4.flash_attn_func(q, k, v, causal=causal), rtol=0, atol=0)


@pytest.mark.parametrize("num_splits", [0, 1, 3, 16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_split_kv_decode_on_cuda_within_tolerance_rule(num_splits, causal):
    """Split-KV (and GQA packing: one query, 4 query heads per kv head) on CUDA against the float64 oracle; then
    the same call captured in a CUDA graph (the partials' workspace is allocated stream-ordered inside it) and
    replayed on new inputs, bitwise equal to an eager call."""
    pytest.importorskip("ml_dtypes", reason="the bfloat16 tolerance needs ml_dtypes")
    require_kernels(torch.bfloat16)
    q, k, v = cuda_tensors(2, 1, 3000, 16, 4, 128, seed=num_splits + 10 * causal)
    out, lse = fa4.flash_attn_func(q, k, v, causal=causal, num_splits=num_splits, return_lse=True)
    ref_out, ref_lse = reference.attention(*(to_numpy_float64(t) for t in (q, k, v)), causal=causal)
    reference.assert_within_rule(to_numpy_float64(out), ref_out, naive_attention(q, k, v, causal=causal),
                                 reference.numpy_dtype("bfloat16"))
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, rtol=1e-4, atol=1e-4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fa4.flash_attn_func(q, k, v, causal=causal, num_splits=num_splits)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fa4.flash_attn_func(q, k, v, causal=causal, num_splits=num_splits)
    new_q, new_k, new_v = cuda_tensors(2, 1, 3000, 16, 4, 128, seed=99)
    q.copy_(new_q), k.copy_(new_k), v.copy_(new_v)
    graph.replay()
    torch.testing.assert_close(captured, fa4.flash_attn_func(q, k, v, causal=causal, num_splits=num_splits),
                               rtol=0, atol=0)


def test_call_overhead_for_a_decode_shape(measurements):
    """Host time of one flash_attn_func call (Python, ctypes, validation, launch) for a decode step, and the
    time of the same call replayed from a CUDA graph, where that host work is gone."""
    require_kernels(torch.bfloat16)
    q, k, v = cuda_tensors(1, 1, 4096, 32, 8, 128)
    for _ in range(20):
        fa4.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    calls = 500
    start = time.perf_counter()
    for _ in range(calls):
        fa4.flash_attn_func(q, k, v, causal=True)
    host_us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fa4.flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        fa4.flash_attn_func(q, k, v, causal=True)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        graph.replay()
    end.record()
    end.synchronize()
    replay_us = begin.elapsed_time(end) / calls * 1e3

    measurements("decode b=1 s_k=4096 h=32/8 d=128 bf16: host time per flash_attn_func call", host_us, "us")
    measurements("decode b=1 s_k=4096 h=32/8 d=128 bf16: per call from a CUDA graph replay", replay_us, "us")
    assert host_us < 1000, f"{host_us:.0f} us per call"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_forward_on_cuda_matches_the_cpu_path(causal):
    """The sm_90a varlen forward (one launch for every sequence, lengths 0 and 1 among them, GQA) and its backward
    through autograd against the CPU backend's on the same bf16 inputs."""
    lengths = [5, 0, 1, 130, 77, 64]
    total = sum(lengths)
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(total, 4, 128, generator=gen).to(torch.bfloat16)
    k = torch.randn(total, 2, 128, generator=gen).to(torch.bfloat16)
    v = torch.randn(total, 2, 128, generator=gen).to(torch.bfloat16)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    with torch.no_grad():
        out_cpu, lse_cpu = fa4.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal,
                                                      return_lse=True)
        out, lse = fa4.flash_attn_varlen_func(q.cuda(), k.cuda(), v.cuda(), cu.cuda(), cu.cuda(), max(lengths),
                                              max(lengths), causal=causal, return_lse=True)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and out.shape == out_cpu.shape
    err = (out.cpu().float() - out_cpu.float()).abs().max().item()
    assert err <= 2e-2, f"max |cuda - cpu| = {err}"
    assert torch.allclose(lse.cpu(), lse_cpu, atol=1e-3, rtol=1e-4)
    dout = torch.randn(total, 4, 128, generator=gen).to(torch.bfloat16)

    def gradients(device):
        qd, kd, vd = (t.to(device).requires_grad_(True) for t in (q, k, v))
        o = fa4.flash_attn_varlen_func(qd, kd, vd, cu.to(device), cu.to(device), max(lengths), max(lengths),
                                       causal=causal)
        return torch.autograd.grad(o, (qd, kd, vd), dout.to(device))

    for name, got, ref in zip("qkv", gradients("cuda"), gradients("cpu")):
        assert torch.isfinite(got).all() and got.shape == ref.shape
        scale = ref.float().abs().max().item()
        err = (got.cpu().float() - ref.float()).abs().max().item()
        assert err <= 2e-2 * max(1.0, scale), f"d{name}: max |cuda - cpu| = {err} (max |cpu| = {scale})"


def varlen_inputs(seed):
    """Packed bf16 q, k, v, dout on CUDA for ragged lengths (0 and 1 among them, keys past seqused_k), the device
    metadata, and the longest lengths."""
    lengths_q, lengths_k, used_k = [5, 0, 1, 130, 77], [9, 3, 1, 140, 77], [9, 0, 1, 120, 77]
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), 4, 128, generator=gen).to(torch.bfloat16).cuda().requires_grad_()
    k = torch.randn(sum(lengths_k), 2, 128, generator=gen).to(torch.bfloat16).cuda().requires_grad_()
    v = torch.randn(sum(lengths_k), 2, 128, generator=gen).to(torch.bfloat16).cuda().requires_grad_()
    dout = torch.randn(sum(lengths_q), 4, 128, generator=gen).to(torch.bfloat16).cuda()
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lengths_q)]), dtype=torch.int32).cuda()
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lengths_k)]), dtype=torch.int32).cuda()
    used = torch.tensor(used_k, dtype=torch.int32).cuda()
    return q, k, v, dout, cu_q, cu_k, used, max(lengths_q), max(used_k)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_backward_under_compile_and_in_a_cuda_graph(causal):
    """flash_attn_varlen_func differentiated on CUDA (device cu_seqlens and seqused_k, as an engine passes them)
    with its forward under torch.compile(fullgraph=True), and captured with its backward in one CUDA graph and
    replayed with new values: the same numbers as eager (out bitwise, gradients within a few ulps); a broadcast
    dout (autograd's layout for a sum) is taken too."""
    require_kernels(torch.bfloat16, backward=True)
    q, k, v, dout, cu_q, cu_k, used, max_q, max_k = varlen_inputs(21)

    def attention(q, k, v):
        return fa4.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, seqused_k=used)

    def step(q, k, v, dout, forward=attention):
        out = forward(q, k, v)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    eager = step(q, k, v, dout)
    assert all(torch.isfinite(t).all() for t in eager)
    torch._dynamo.reset()  # autograd.grad stays outside the compiled region, as in the dense compile test
    assert_same_computation(step(q, k, v, dout, forward=torch.compile(attention, fullgraph=True)), eager)
    broadcast = dout[:1].expand(dout.shape)  # strides (0, d, 1): the sum over rows' gradient, as autograd hands it
    assert all(torch.isfinite(t).all() for t in step(q, k, v, broadcast))

    # The graph on fresh leaves: an autograd leaf keeps the stream of its first backward (PyTorch #164302), and the
    # steps above ran on the default stream, which a capture on another stream may not wait on (the first run of
    # this test failed with cudaErrorStreamCaptureImplicit that way); PyTorch's recipe warms up on a side stream.
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(q, k, v, dout)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(q, k, v, dout)
    for replay in range(2):
        new = varlen_inputs(22 + replay)
        with torch.no_grad():
            for static, fresh in zip((q, k, v, dout), new[:4]):
                static.copy_(fresh)
        graph.replay()
        assert_same_computation(captured, step(q, k, v, dout))


@pytest.mark.parametrize("page_size", [0, 16, 64], ids=["contiguous", "page16", "page64"])
@pytest.mark.parametrize("num_splits", [0, 1, 4])
def test_kvcache_decode_on_cuda_matches_the_cpu_backend(page_size, num_splits):
    """flash_attn_with_kvcache on CUDA (the sm_90a kernels reading the pages in place and appending k/v) against
    the same call on the CPU backend: the caches after the append bit for bit, out and lse within the bf16 rule's
    reach of each other. Slots and pages no sequence uses are NaN; they must not reach any output."""
    require_kernels(torch.bfloat16)
    g = torch.Generator().manual_seed(case_seed("kvcache", page_size, num_splits))
    batch, heads, heads_kv, dim, seqlen_new = 4, 16, 4, 128, 1
    cached = [0, 1, 700, 1500]
    capacity = 1600
    if page_size:
        max_pages = capacity // page_size
        table = torch.randperm(batch * max_pages + 3, generator=g)[:batch * max_pages].to(torch.int32)
        page_table = table.reshape(batch, max_pages).contiguous()
        shape = (batch * max_pages + 3, page_size, heads_kv, dim)
    else:
        page_table, shape = None, (batch, capacity, heads_kv, dim)
    k_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16)
    v_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16)
    for b, c in enumerate(cached):
        for j in range(c):
            where = (page_table[b, j // page_size], j % page_size) if page_size else (b, j)
            k_cache[where] = torch.randn(heads_kv, dim, generator=g).to(torch.bfloat16)
            v_cache[where] = torch.randn(heads_kv, dim, generator=g).to(torch.bfloat16)
    q = torch.randn(batch, 1, heads, dim, generator=g).to(torch.bfloat16)
    k_new = torch.randn(batch, seqlen_new, heads_kv, dim, generator=g).to(torch.bfloat16)
    v_new = torch.randn(batch, seqlen_new, heads_kv, dim, generator=g).to(torch.bfloat16)
    lens = torch.tensor(cached, dtype=torch.int32)
    gpu = [t.cuda() if t is not None else None for t in (q, k_cache, v_cache, k_new, v_new, lens, page_table)]
    out, lse = fa4.flash_attn_with_kvcache(*gpu[:5], cache_seqlens=gpu[5], page_table=gpu[6], causal=True,
                                           num_splits=num_splits, return_softmax_lse=True)
    ref_out, ref_lse = fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens,
                                                   page_table=page_table, causal=True, return_softmax_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(gpu[1].cpu().view(torch.int16), k_cache.view(torch.int16))
    assert torch.equal(gpu[2].cpu().view(torch.int16), v_cache.view(torch.int16))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().float(), ref_out.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.cpu(), ref_lse, rtol=1e-3, atol=1e-3)


def test_kvcache_decode_captures_in_a_cuda_graph():
    """A paged decode call with its append, captured once and replayed: each replay appends at the same slot and
    gives the same output (the metadata are device tensors, read at replay)."""
    require_kernels(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(5)
    batch, heads, heads_kv, dim, page = 2, 8, 2, 128, 64
    k_cache = torch.randn(batch * 8, page, heads_kv, dim, generator=g, device="cuda").to(torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    page_table = torch.arange(batch * 8, dtype=torch.int32, device="cuda").reshape(batch, 8).flip(1).contiguous()
    lens = torch.tensor([100, 400], dtype=torch.int32, device="cuda")
    q = torch.randn(batch, 1, heads, dim, generator=g, device="cuda").to(torch.bfloat16)
    k_new = torch.randn(batch, 1, heads_kv, dim, generator=g, device="cuda").to(torch.bfloat16)
    v_new = torch.randn_like(k_new)
    eager = fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, page_table=page_table)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture stream
        fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, page_table=page_table)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fa4.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens,
                                               page_table=page_table)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager, rtol=0, atol=0)
