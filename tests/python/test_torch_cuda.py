"""fa4 on CUDA tensors: values, SDPA comparison, opcheck, torch.compile, CUDA-graph capture and replay, and the
per-call overhead of a decode-sized call.

Every test here is marked `gpu`. Without a GPU they skip with that reason; on a GPU whose libfa4 has no CUDA
kernels (fa4_supports answers FA4_ERROR_UNSUPPORTED) they skip with the library's reason, except the test that
checks that this reason reaches the caller as fa4.UnsupportedError."""

import time

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
                 requires_grad=False):
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def draw(seqlen, heads):
        x = torch.randn(batch, seqlen, heads, head_dim, generator=generator, device="cuda").to(dtype)
        return x.requires_grad_(requires_grad)
    return draw(seqlen_q, heads_q), draw(seqlen_k, heads_kv), draw(seqlen_k, heads_kv)


def library_support(dtype=torch.bfloat16, backward=False, **options):
    return fa4.supports(*cuda_tensors(1, 128, 128, 2, 2, 128, dtype=dtype), backward=backward, **options)


def require_kernels(dtype=torch.bfloat16, backward=False):
    """Skip, with the library's own reason, when it cannot run this pass on CUDA tensors of this dtype."""
    support = library_support(dtype, backward)
    if not support:
        pytest.skip(f"libfa4 cannot run the {'backward' if backward else 'forward'} pass on CUDA {dtype}: "
                    f"{support.reason}")


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
    torch.library.opcheck(torch.ops.fa4.forward.default, (q, k, v, None, True, -1, -1, 0.0, False))


def attention_block(q, k, v):
    return fa4.flash_attn_func(q * 1.5, k, v, causal=True).float().relu().sum(dim=-1)


def test_torch_compile_fullgraph_on_cuda():
    require_kernels(torch.bfloat16, backward=True)
    torch._dynamo.reset()
    compiled = torch.compile(attention_block, fullgraph=True)
    inputs = cuda_tensors(2, 128, 256, 8, 2, 128, requires_grad=True)
    eager_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    torch.testing.assert_close(compiled(*inputs), attention_block(*eager_inputs), rtol=2e-2, atol=2e-2)
    compiled(*inputs).sum().backward()
    attention_block(*eager_inputs).sum().backward()
    for ours, eager in zip(inputs, eager_inputs):
        torch.testing.assert_close(ours.grad, eager.grad, rtol=2e-2, atol=2e-2)


def test_cuda_graph_capture_and_replay():
    require_kernels(torch.bfloat16, backward=True)
    q, k, v = cuda_tensors(2, 128, 256, 8, 2, 128, requires_grad=True)
    dout = torch.randn_like(q)

    def step():
        out = fa4.flash_attn_func(q, k, v, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    side = torch.cuda.Stream()  # warm up off the default stream, as torch.cuda.graph requires
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    for seed in (1, 2):  # new inputs in the same memory, then replay
        new_q, new_k, new_v = cuda_tensors(2, 128, 256, 8, 2, 128, seed=seed)
        with torch.no_grad():
            q.copy_(new_q), k.copy_(new_k), v.copy_(new_v)
        graph.replay()
        eager = step()
        for replayed, expected in zip(captured, eager):
            torch.testing.assert_close(replayed, expected, rtol=0, atol=0)


def test_forward_opcheck_on_cuda():
    """The forward alone (inputs without grad), so it runs wherever the CUDA forward does."""
    require_kernels(torch.bfloat16)
    q, k, v = cuda_tensors(2, 64, 96, 4, 2, 128)
    for causal in (False, True):
        torch.library.opcheck(torch.ops.fa4.forward.default, (q, k, v, None, causal, -1, -1, 0.0, False))


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
