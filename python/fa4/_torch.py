"""fa4 for PyTorch: the custom ops fa4::forward and fa4::backward (torch.library, so torch.compile traces
through them without a graph break and autograd differentiates them), and FlashAttention's flash_attn_func.

CPU tensors run on the CPU backend, CUDA tensors on the GPU kernels, on the current CUDA stream (so CUDA-graph
capture works: nothing here synchronizes, and outputs and workspaces come from torch's caching allocator).
Whether a call can run is the library's decision alone: its refusals arrive as fa4.UnsupportedError."""

import contextlib
from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _capi
from .errors import InvalidArgumentError, UnsupportedError

_DTYPE_CODES = {torch.float32: _capi.F32, torch.float16: _capi.F16, torch.bfloat16: _capi.BF16,
                torch.float64: _capi.F64}


def _kind(call, name, t):
    """(dtype code, device, device index) of a torch tensor's fa4_tensor."""
    code = _DTYPE_CODES.get(t.dtype)
    if code is None:
        raise InvalidArgumentError(f"{call}: argument '{name}': expected dtype float32, float16, bfloat16 or "
                                   f"float64, got {t.dtype}")
    # is_cuda / get_device() rather than t.device, which builds a torch.device per access (host cost, issue 12).
    if t.is_cuda:
        return code, _capi.CUDA, t.get_device()
    if t.is_cpu:
        return code, _capi.CPU, 0
    raise InvalidArgumentError(f"{call}: argument '{name}': expected a cpu or cuda tensor, got device {t.device}")


def describe(call, name, t):
    """The fa4_tensor of a torch tensor (its storage, shape and strides as they are)."""
    code, device, index = _kind(call, name, t)
    if t.dim() == 4:  # the dense call's tensors: packed here, one Python call less each (issue 12's host cost)
        return _capi.PACK_TENSOR(t.data_ptr(), code, device, index, 4, *t.shape, *t.stride())
    return _capi.tensor(call, name, t.data_ptr() or None, code, device, index, t.shape, t.stride())


def _describe_fresh(t, kind, shape):
    """The fa4_tensor of t, a rank-4 tensor just made contiguous with this kind (_kind) and shape: its strides are
    torch's contiguous ones (a size-0 dim counting as 1), computed rather than asked (issue 12's host cost)."""
    b, s, h, d = shape
    s2 = max(d, 1)
    s1 = s2 * max(h, 1)
    return _capi.PACK_TENSOR(t.data_ptr(), *kind, 4, b, s, h, d, s1 * max(s, 1), s1, s2, 1)


def _tma_readable_dout(dout):
    """dout's layout is autograd's choice, not the caller's (a broadcast from sum/mean, a view into a larger
    gradient at any offset), and the GPU kernels read it with TMA (16-byte aligned base and strides, no broadcast
    sequence): on CUDA they get a fresh contiguous copy unless it already is one (usually)."""
    if dout.is_cuda and (not dout.is_contiguous() or dout.data_ptr() % 16 != 0):
        return dout.clone(memory_format=torch.contiguous_format)
    return dout


def _unit_head_dim_stride(t):
    # fa4 reads head_dim contiguously; any other stride is free. FlashAttention copies in this case too.
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _described_unit(call, name, t):
    """(t, its _kind, its packed fa4_tensor) with t made contiguous first where _unit_head_dim_stride would copy
    it, in one pass over its strides (issue 12's host cost; a tensor of rank 0 is described as it is: the caller or
    the library refuses its rank by name). The caller binds the returned tensor until the library call: a
    descriptor holds only its address."""
    kind = _kind(call, name, t)
    shape, strides = t.shape, t.stride()
    if shape and strides[-1] != 1 and shape[-1] > 1:
        t = t.contiguous()
        strides = t.stride()
    if len(shape) == 4:
        return t, kind, _capi.PACK_TENSOR(t.data_ptr(), *kind, 4, *shape, *strides)
    return t, kind, _capi.tensor(call, name, t.data_ptr() or None, *kind, shape, strides)


def _lse_shape(q):
    return (q.shape[0], q.shape[2], q.shape[1])


# The current CUDA device without torch.cuda.current_device()'s Python wrapper (host cost): a CUDA tensor exists,
# so CUDA is initialized. The public call is the fallback.
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def _switch_target(index):
    """CUDA device `index` where it is not the current device (a launch there must switch to it), else None."""
    return None if index == (_current_device() if _current_device is not None else torch.cuda.current_device()) \
        else index


def _device_guard(q):
    # Kernels launch on the current device: make it q's (nothing to do in the common single-GPU case).
    target = _switch_target(q.get_device()) if q.is_cuda else None
    return contextlib.nullcontext() if target is None else torch.cuda.device(target)


# The current stream's handle without building a torch.cuda.Stream object per call (issue 12's host cost):
# torch's own generated code (inductor's get_raw_stream) reads it this way; the public call is the fallback.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_of(index):
    return _raw_stream(index) if _raw_stream is not None else torch.cuda.current_stream(index).cuda_stream


def _stream(q):
    return _stream_of(q.get_device()) if q.is_cuda else None


def _launch_on(kind):
    """(the device to make current for the launch, None where it already is or the tensor is on the CPU; the
    current stream's handle on its device, None for a CPU tensor) of the tensor whose _kind this is: _device_guard's
    and _stream's answers without asking the tensor again, with no context to enter in the common single-GPU case
    (host cost, issue 12)."""
    if kind[1] != _capi.CUDA:
        return None, None
    index = kind[2]
    return _switch_target(index), _stream_of(index)


def _workspace(pass_, inputs, options, device):
    """(tensor keeping it alive, pointer, bytes) of the workspace the pass asks for (the CUDA backward: its fp32
    dQ accumulator and row statistics), on q's device, from torch's caching allocator on the current stream, the
    stream the call is launched on (so CUDA-graph capture records it in the graph's pool, and the block goes back
    to the cache stream-ordered when the tensor dies, after the launch). The library initializes what it reads."""
    nbytes = _capi.workspace_size(pass_, *inputs, options)
    if nbytes == 0:
        return None, None, 0
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buffer, buffer.data_ptr(), nbytes


def _sinks(call, sink):
    """The fa4_tensor of learnable_sink (None: no sinks)."""
    return None if sink is None else describe(call, "learnable_sink", sink)


def _check_sink(call, sink):
    """learnable_sink is None or a float32 [heads] tensor (its length and device the library checks)."""
    if sink is not None and (not isinstance(sink, torch.Tensor) or sink.dim() != 1 or sink.dtype != torch.float32):
        got = f"{sink.dtype} rank {sink.dim()}" if isinstance(sink, torch.Tensor) else type(sink).__name__
        raise InvalidArgumentError(f"{call}: argument 'learnable_sink': expected a float32 tensor [heads], got {got}")


def _backward_outputs(call, q, k, v, learnable_sink, softmax_scale, causal, window_left, window_right, softcap,
                      deterministic):
    """What both backward ops allocate and describe: (dq, dk, dv) shaped as q, k, v in q's dtype; dsink (float32
    [heads], empty without sinks); the fa4_tensors of q, k, v; the fa4_options (with the sinks and dsink)."""
    grads = [torch.empty(t.shape, dtype=q.dtype, device=q.device) for t in (q, k, v)]
    dsink = torch.empty(0 if learnable_sink is None else learnable_sink.shape, dtype=torch.float32, device=q.device)
    inputs = [describe(call, name, t) for name, t in (("q", q), ("k", k), ("v", v))]
    options = _capi.options(call, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                            sinks=_sinks(call, learnable_sink),
                            dsinks=None if learnable_sink is None else describe(call, "dsink", dsink))
    return grads, dsink, inputs, options


def _forward_impl(q, k, v, learnable_sink, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                  num_splits, need_lse):
    """(out, lse): out [b, s_q, h, d] contiguous in q's dtype, lse [b, h, s_q] float32 (None unless need_lse:
    the library then writes none, and the call allocates one tensor less)."""
    call = "fa4.flash_attn_func"
    q, k, v = (_unit_head_dim_stride(t) for t in (q, k, v))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device) if need_lse else None
    inputs = [describe(call, name, t) for name, t in (("q", q), ("k", k), ("v", v))]
    options = _capi.options(call, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                            sinks=_sinks(call, learnable_sink), num_splits=num_splits)
    with _device_guard(q):
        _keep, workspace, workspace_bytes = _workspace(_capi.FORWARD, inputs, options, q.device)
        _capi.forward(*inputs, describe(call, "out", out), None if lse is None else describe(call, "lse", lse),
                      options, workspace, workspace_bytes, _stream(q))
    return out, lse


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, learnable_sink: Optional[torch.Tensor],
             softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int, softcap: float,
             deterministic: bool, num_splits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): out [b, s_q, h, d] contiguous in q's dtype, lse [b, h, s_q] float32."""
    return _forward_impl(q, k, v, learnable_sink, softmax_scale, causal, window_left, window_right, softcap,
                         deterministic, num_splits, True)


forward_op = torch.library.custom_op("fa4::forward", mutates_args=(), device_types=("cpu", "cuda"))(_forward)


# torch.autograd.graph.increment_version's own call, without its Python wrapper (host cost); the public one is the
# fallback.
_increment_version = getattr(torch._C, "_increment_version", torch.autograd.graph.increment_version)


_is_tracing = getattr(torch._C, "_is_tracing", torch.jit.is_tracing)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack",
                          lambda: 0 if _get_current_dispatch_mode() is None else 1)


def _plain_call(tensors):
    """Whether a forward may skip the custom op's dispatch (about 15 us of host time per call) and run
    _forward_impl directly: real cpu or cuda tensors (no fake, meta or other subclass), nothing to differentiate,
    and nothing watching the op (torch.compile, jit tracing, functorch transforms, torch function or dispatch
    modes such as FlopCounterMode or FakeTensorMode). The op and _forward_impl compute the same thing; the op is
    what those machineries need to see."""
    # _is_tracing is torch.jit.is_tracing()'s answer outside TorchScript without its Python wrapper (host cost);
    # is_compiling() stays the public call, which dynamo recognizes while it traces this function.
    # A dispatch mode is active exactly when the mode stack is not empty (_get_current_dispatch_mode's own test,
    # without its Python frame).
    if torch.compiler.is_compiling() or _is_tracing() or torch._C._are_functorch_transforms_active() \
            or torch._C._is_torch_function_mode_enabled() or _dispatch_modes() > 0:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or not (t.is_cuda or t.is_cpu) or (grad and t.requires_grad)):
            return False
    return True


@forward_op.register_fake
def _forward_fake(q, k, v, learnable_sink, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                  num_splits=0):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=torch.float32)


@torch.library.custom_op("fa4::backward", mutates_args=(), device_types=("cpu", "cuda"))
def backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor, learnable_sink: Optional[torch.Tensor], softmax_scale: Optional[float],
                causal: bool, window_left: int, window_right: int, softcap: float,
                deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink): dq, dk, dv contiguous, shaped as q, k, v; dsink float32 [heads] (empty without
    learnable_sink)."""
    call = "fa4.flash_attn_func (backward)"
    dout, q, k, v, out = (_unit_head_dim_stride(t) for t in (dout, q, k, v, out))
    dout = _tma_readable_dout(dout)
    grads, dsink, inputs, options = _backward_outputs(call, q, k, v, learnable_sink, softmax_scale, causal,
                                                      window_left, window_right, softcap, deterministic)
    with _device_guard(q):
        _keep, workspace, workspace_bytes = _workspace(_capi.BACKWARD, inputs, options, q.device)
        _capi.backward(*inputs, describe(call, "out", out), describe(call, "dout", dout), describe(call, "lse", lse),
                       *(describe(call, name, g) for name, g in zip(("dq", "dk", "dv"), grads)), options, workspace,
                       workspace_bytes, _stream(q))
    return (*grads, dsink)


@backward_op.register_fake
def _backward_fake(dout, q, k, v, out, lse, learnable_sink, softmax_scale, causal, window_left, window_right,
                   softcap, deterministic):
    dsink = q.new_empty(0 if learnable_sink is None else learnable_sink.shape, dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape, dtype=q.dtype), v.new_empty(v.shape, dtype=q.dtype), dsink


# The backward takes the forward's options but num_splits (split-KV is forward only: the gradient is that of
# the same attention, computed unsplit).
_BACKWARD_OPTIONS = 6  # softmax_scale, causal, window_left, window_right, softcap, deterministic


def _setup_context(ctx, inputs, output):
    q, k, v, learnable_sink, *options = inputs
    ctx.options, ctx.input_count = tuple(options[:_BACKWARD_OPTIONS]), len(inputs)
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, learnable_sink)
    # FlashAttention does not differentiate through the LSE; say so rather than silently dropping its gradient.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, learnable_sink = ctx.saved_tensors
    dq, dk, dv, dsink = backward_op(dout, q, k, v, out, lse, learnable_sink, *ctx.options)
    return (dq, dk, dv, None if learnable_sink is None else dsink) + (None,) * (ctx.input_count - 4)


forward_op.register_autograd(_backward, setup_context=_setup_context)


def _int(call, name, value):
    """An integer argument as int (ints, numpy ints, 0-d integer tensors; not bools or floats)."""
    if type(value) is int:  # the common call: nothing to convert (bool is not int's type)
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{call}: argument '{name}': expected an integer, got {value!r}")
    return int(value.__index__())


def _check_tensors(call, qkv, rank, layout):
    q, k, v = qkv
    if type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor and q.dim() == rank \
            and k.dim() == rank and v.dim() == rank:  # the common call, in fewer Python steps (host cost)
        return
    for name, t in zip(("q", "k", "v"), qkv):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"{call}: argument '{name}': expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise InvalidArgumentError(f"{call}: argument '{name}': expected rank {rank} ({layout}), got rank "
                                       f"{t.dim()} (shape {list(t.shape)})")


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    deterministic=False, return_lse=False, learnable_sink=None, num_splits=0):
    """FlashAttention's flash_attn_func on fa4.

    q: [batch, seqlen_q, heads, head_dim], k, v: [batch, seqlen_k, heads_kv, head_dim] with heads % heads_kv == 0
    (GQA/MQA); float16, bfloat16, float32 or float64 (float32/float64 run on the CPU backend; CUDA kernels take
    what the build has); any strides with the head_dim stride made 1. softmax_scale defaults to
    1/sqrt(head_dim); causal is bottom-right aligned (row i sees keys j <= i + seqlen_k - seqlen_q); window_size
    = (left, right), -1 or None = unbounded; softcap: s <- softcap·tanh(s/softcap) on scaled scores, 0 = off;
    deterministic: bitwise-reproducible backward, passed to the library (the CPU backend always is; where a
    backend has no deterministic backward the backward raises fa4.UnsupportedError saying so). Returns out, or
    (out, lse) with return_lse=True; lse is float32 [batch, heads, seqlen_q], natural log, and not
    differentiated. The backward (autograd) runs the library's backward on the same device and stream rules.
    learnable_sink (FlashAttention-4's name; gpt-oss's sinks): float32 [heads] logits, one per query head, that
    join every row's softmax denominator as a key of value zero (lse includes them); differentiable, on CPU and
    CUDA tensors. num_splits: split-KV ranges for the forward (0: the backend's choice; n: n key ranges merged by their LSE, the same result up to rounding); the backward is the
    unsplit one whatever it is."""
    call = "fa4.flash_attn_func"
    _check_tensors(call, (q, k, v), 4, "[batch, seqlen, heads, head_dim]")
    _check_sink(call, learnable_sink)
    window_left, window_right = _capi.window_bounds(call, window_size)
    args = (q, k, v, learnable_sink, None if softmax_scale is None else float(softmax_scale), bool(causal),
            window_left, window_right, float(softcap), bool(deterministic), _int(call, "num_splits", num_splits))
    if _plain_call((q, k, v, learnable_sink)):
        out, lse = _forward_impl(*args, need_lse=bool(return_lse))
    else:
        out, lse = forward_op(*args)
    return (out, lse) if return_lse else out


# ---- variable-length batches ----------------------------------------------------------------------------------

def _varlen(call, q, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k):
    """The fa4_varlen of FlashAttention's varlen arguments: int32 1-D contiguous offsets on q's device."""
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k)):
        if t is None and name == "seqused_k":
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous() \
                or t.device != q.device:
            got = (f"{t.dtype} rank {t.dim()}{'' if t.is_contiguous() else ' non-contiguous'} on {t.device}"
                   if isinstance(t, torch.Tensor) else type(t).__name__)
            raise InvalidArgumentError(f"{call}: argument '{name}': expected a contiguous 1-D int32 tensor on "
                                       f"{q.device}, got {got}")
    batch = cu_seqlens_q.shape[0] - 1
    for name, t, n in (("cu_seqlens_k", cu_seqlens_k, batch + 1), ("seqused_k", seqused_k, batch)):
        if t is not None and t.shape[0] != n:
            raise InvalidArgumentError(f"{call}: argument '{name}': expected {n} entries (cu_seqlens_q has "
                                       f"{batch + 1}), got {t.shape[0]}")
    if batch < 0:
        raise InvalidArgumentError(f"{call}: argument 'cu_seqlens_q': expected batch + 1 >= 1 entries, got 0")
    return _capi.Varlen(cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(),
                        None if seqused_k is None else seqused_k.data_ptr(), batch, int(max_seqlen_q),
                        int(max_seqlen_k))


@torch.library.custom_op("fa4::forward_varlen", mutates_args=(), device_types=("cpu", "cuda"))
def forward_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, learnable_sink: Optional[torch.Tensor],
                      cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor],
                      max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float], causal: bool,
                      window_left: int, window_right: int, softcap: float,
                      deterministic: bool, num_splits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): out [total_q, h, d] contiguous in q's dtype, lse [h, total_q] float32."""
    call = "fa4.flash_attn_varlen_func"
    q, k, v = (_unit_head_dim_stride(t) for t in (q, k, v))
    varlen = _varlen(call, q, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    inputs = [describe(call, name, t) for name, t in (("q", q), ("k", k), ("v", v))]
    options = _capi.options(call, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                            sinks=_sinks(call, learnable_sink), num_splits=num_splits)
    with _device_guard(q):
        _capi.forward_varlen(*inputs, describe(call, "out", out), describe(call, "lse", lse), varlen, options, None,
                             0, _stream(q))
    return out, lse


@forward_varlen_op.register_fake
def _forward_varlen_fake(q, k, v, learnable_sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal, window_left, window_right, softcap, deterministic, num_splits=0):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("fa4::backward_varlen", mutates_args=(), device_types=("cpu", "cuda"))
def backward_varlen_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, learnable_sink: Optional[torch.Tensor], cu_seqlens_q: torch.Tensor,
                       cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor], max_seqlen_q: int,
                       max_seqlen_k: int, softmax_scale: Optional[float], causal: bool, window_left: int,
                       window_right: int, softcap: float,
                       deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink): contiguous, shaped as q, k, v; dsink float32 [heads] (empty without learnable_sink)."""
    call = "fa4.flash_attn_varlen_func (backward)"
    dout, q, k, v, out = (_unit_head_dim_stride(t) for t in (dout, q, k, v, out))
    dout = _tma_readable_dout(dout)
    varlen = _varlen(call, q, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
    grads, dsink, inputs, options = _backward_outputs(call, q, k, v, learnable_sink, softmax_scale, causal,
                                                      window_left, window_right, softcap, deterministic)
    with _device_guard(q):
        nbytes = _capi.workspace_size_varlen(_capi.BACKWARD, *inputs, varlen, options)
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device) if nbytes else None  # as _workspace
        _capi.backward_varlen(*inputs, describe(call, "out", out), describe(call, "dout", dout),
                              describe(call, "lse", lse),
                              *(describe(call, name, g) for name, g in zip(("dq", "dk", "dv"), grads)), varlen,
                              options, None if workspace is None else workspace.data_ptr(), nbytes, _stream(q))
    return (*grads, dsink)


@backward_varlen_op.register_fake
def _backward_varlen_fake(dout, q, k, v, out, lse, learnable_sink, cu_seqlens_q, cu_seqlens_k, seqused_k,
                          max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                          deterministic):
    dsink = q.new_empty(0 if learnable_sink is None else learnable_sink.shape, dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape, dtype=q.dtype), v.new_empty(v.shape, dtype=q.dtype), dsink


def _setup_varlen_context(ctx, inputs, output):
    q, k, v, sink, cu_q, cu_k, used_k, *options = inputs
    ctx.options, ctx.input_count = tuple(options[:2 + _BACKWARD_OPTIONS]), len(inputs)  # max_seqlen_q/k, then those
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sink, cu_q, cu_k, used_k)
    ctx.mark_non_differentiable(lse)


def _backward_varlen(ctx, dout, _dlse):
    q, k, v, out, lse, sink, cu_q, cu_k, used_k = ctx.saved_tensors
    dq, dk, dv, dsink = backward_varlen_op(dout, q, k, v, out, lse, sink, cu_q, cu_k, used_k, *ctx.options)
    return (dq, dk, dv, None if sink is None else dsink) + (None,) * (ctx.input_count - 4)


forward_varlen_op.register_autograd(_backward_varlen, setup_context=_setup_varlen_context)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False,
                           return_lse=False, seqused_k=None, learnable_sink=None, num_splits=0):
    """FlashAttention's flash_attn_varlen_func on fa4 (same positional order; dropout is not implemented, so
    dropout_p must be 0).

    q: [total_q, heads, head_dim], k, v: [total_k, heads_kv, head_dim]: the sequences packed without padding;
    sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v
    (its first seqused_k[b] keys when seqused_k is given). cu_seqlens_* and seqused_k: int32 1-D tensors on q's
    device; max_seqlen_q/k: the longest sequences. Options as flash_attn_func's, applied per sequence. Returns
    out, or (out, lse) with return_lse=True, lse float32 [heads, total_q]. learnable_sink as flash_attn_func's
    (one per head, shared by every sequence; its gradient sums over them). CPU tensors run on the CPU backend;
    on CUDA tensors the sm_90a varlen kernels run both passes (cu_seqlens are trusted, as FlashAttention does;
    the forward leaves rows of no sequence as they are, the backward gives them zero gradients). The CUDA
    backward's workspace (from torch's allocator) follows the packed rows: about heads · (total_q + batch ·
    block_m) · (head_dim + 2) · 4 bytes (block_m 64 or 128), or batch · heads · max_seqlen_q · (head_dim + 2) · 4
    where that is smaller; deterministic mode adds a dQ copy per turn chain. num_splits as flash_attn_func's (0
    or 1 on CUDA)."""
    call = "fa4.flash_attn_varlen_func"
    if dropout_p != 0.0:
        raise UnsupportedError(f"{call}: argument 'dropout_p': expected 0.0 (fa4 has no attention dropout), got "
                               f"{dropout_p}")
    _check_tensors(call, (q, k, v), 3, "[total, heads, head_dim]")
    _check_sink(call, learnable_sink)
    window_left, window_right = _capi.window_bounds(call, window_size)
    out, lse = forward_varlen_op(q, k, v, learnable_sink, cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q),
                                 int(max_seqlen_k), None if softmax_scale is None else float(softmax_scale),
                                 bool(causal), window_left, window_right, float(softcap), bool(deterministic),
                                 _int(call, "num_splits", num_splits))
    return (out, lse) if return_lse else out



# ---- KV cache (decode) ----------------------------------------------------------------------------------------

def _int32_metadata(call, name, t, q, q_kind, rank, rows):
    """t (cache_seqlens: rank 1, page_table: rank 2) is a contiguous int32 tensor on q's device with `rows` rows
    (q_kind: q's _kind)."""
    # Devices compared through is_cuda / get_device() and q's kind: t.device builds a torch.device per access, and
    # q's device is known already (host cost).
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != rank or not t.is_contiguous() \
            or not ((t.is_cuda and t.get_device() == q_kind[2]) if q_kind[1] == _capi.CUDA else t.is_cpu) \
            or t.shape[0] != rows:
        got = (f"{t.dtype} shape {list(t.shape)}{'' if t.is_contiguous() else ' non-contiguous'} on {t.device}"
               if isinstance(t, torch.Tensor) else type(t).__name__)
        layout = "[batch]" if rank == 1 else "[batch, max_pages]"
        raise InvalidArgumentError(f"{call}: argument '{name}': expected a contiguous int32 tensor {layout} "
                                   f"(batch = {rows}) on {q.device}, got {got}")


def _forward_kvcache_impl(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, learnable_sink, softmax_scale,
                          causal, window_left, window_right, softcap, num_splits, need_lse):
    """(out, lse): out [b, s_q, h, d] contiguous in q's dtype, lse [b, h, s_q] float32 (None unless need_lse: the
    library then writes none). With k_new and v_new, writes them into k_cache and v_cache (in place) first."""
    call = "fa4.flash_attn_with_kvcache"
    q, q_kind, q_d = _described_unit(call, "q", q)  # q's kind and shape serve out's descriptor too (out is like q)
    q_shape = q.shape
    if len(q_shape) != 4:  # the op called directly (the public call checked it): named, not an IndexError
        raise InvalidArgumentError(f"{call}: argument 'q': expected rank 4 ([batch, seqlen, heads, head_dim]), got "
                                   f"rank {len(q_shape)}")
    rows = q_shape[0]
    if cache_seqlens is not None:
        _int32_metadata(call, "cache_seqlens", cache_seqlens, q, q_kind, 1, rows)
    if page_table is not None:
        _int32_metadata(call, "page_table", page_table, q, q_kind, 2, rows)
    # A contiguous q's like is contiguous already (its size-1 dims' strides may differ, which no address sees, and
    # _describe_fresh describes out with torch's own); the memory_format argument costs ~0.5 us (issue 12).
    out = torch.empty_like(q) if q.is_contiguous() else torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device) if need_lse else None
    # The caches are written in place: described as they are (a copy would lose the append; fa4 names a
    # non-unit head_dim stride). Described before k and v, so a bad dtype is named in the arguments' order.
    k_cache_d, v_cache_d = describe(call, "k_cache", k_cache), describe(call, "v_cache", v_cache)
    # Bound here, not made inside the descriptor's expression: a head-dim copy must outlive the library call (a
    # descriptor holds only its address; a copy freed before the call was read as garbage). Each on its own: the
    # op called directly with one of them is the library's to refuse by name.
    k_new, _, k_new_d = (None, None, None) if k_new is None else _described_unit(call, "k", k_new)
    v_new, _, v_new_d = (None, None, None) if v_new is None else _described_unit(call, "v", v_new)
    out_d = _describe_fresh(out, q_kind, q_shape)
    kvcache = _capi.KvCache(None if cache_seqlens is None else cache_seqlens.data_ptr(),
                            None if page_table is None else page_table.data_ptr(),
                            0 if page_table is None else page_table.shape[1],
                            k_new_d, v_new_d)
    # The sinks' descriptor is _sinks's expression written out: a Python frame less on the decode path (issue 12).
    options = _capi.options(call, softmax_scale, causal, window_left, window_right, softcap, False,
                            sinks=None if learnable_sink is None else describe(call, "learnable_sink", learnable_sink),
                            num_splits=num_splits)
    switch_to, stream = _launch_on(q_kind)
    launch = (q_d, k_cache_d, v_cache_d, out_d, None if lse is None else describe(call, "lse", lse), kvcache, options,
              None, 0, stream)
    if switch_to is None:
        _capi.forward_kvcache(*launch)
    else:
        with torch.cuda.device(switch_to):
            _capi.forward_kvcache(*launch)
    return out, lse


def _forward_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: Optional[torch.Tensor],
                     v_new: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor],
                     page_table: Optional[torch.Tensor], learnable_sink: Optional[torch.Tensor],
                     softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
                     softcap: float, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): out [b, s_q, h, d] contiguous in q's dtype, lse [b, h, s_q] float32. With k_new and v_new,
    writes them into k_cache and v_cache (in place) first."""
    return _forward_kvcache_impl(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, learnable_sink,
                                 softmax_scale, causal, window_left, window_right, softcap, num_splits, True)


forward_kvcache_op = torch.library.custom_op("fa4::forward_kvcache", mutates_args=("k_cache", "v_cache"),
                                             device_types=("cpu", "cuda"))(_forward_kvcache)


@forward_kvcache_op.register_fake
def _forward_kvcache_fake(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, learnable_sink, softmax_scale,
                          causal, window_left, window_right, softcap, num_splits):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=torch.float32)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, page_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, num_splits=0,
                            return_softmax_lse=False, learnable_sink=None, *, block_table=None):
    """FlashAttention's flash_attn_with_kvcache on fa4: attention of q against a KV cache, forward only (no
    autograd: the output does not require grad, and inputs that do are refused while grad mode is on).

    q: [batch, seqlen_q, heads, head_dim]. The cache is contiguous, k_cache/v_cache [batch, seqlen_cache, heads_kv,
    head_dim], or paged when page_table is given: [num_pages, page_size, heads_kv, head_dim] with page_size a
    multiple of 16, and page_table int32 [batch, max_pages] listing each sequence's pages in order (FlashAttention
    2 calls it block_table; either name, not both). cache_seqlens: int, or int32 [batch], the keys already in each
    sequence's cache; None: the caches are full. k, v: optional [batch, seqlen_new, heads_kv, head_dim], written
    into the cache in place at cache_seqlens[b] before attending, so that sequence b sees cache_seqlens[b] +
    seqlen_new keys (cache_seqlens itself is not advanced: the caller does that). causal is bottom-right over the
    sequence's keys (a decode query sees every cached key); window_size, softcap, softmax_scale, learnable_sink as
    flash_attn_func's; num_splits: split-KV ranges (0: the backend's choice). Returns out, or (out, lse) with
    return_softmax_lse=True (lse float32 [batch, heads, seqlen_q]). CPU and CUDA tensors (on CUDA the append and
    the attention run on the current stream, CUDA-graph capturable)."""
    call = "fa4.flash_attn_with_kvcache"
    _check_tensors(call, (q, k_cache, v_cache), 4, "[batch, seqlen, heads, head_dim] or [pages, page_size, heads, "
                                                   "head_dim]")
    if block_table is not None:
        if page_table is not None:
            raise InvalidArgumentError(f"{call}: argument 'block_table': expected None when page_table is given "
                                       f"(two names for one argument), got a tensor")
        page_table = block_table
    if (k is None) != (v is None):
        missing = "v" if v is None else "k"
        raise InvalidArgumentError(f"{call}: argument '{missing}': expected a tensor (k and v are appended "
                                   f"together), got None")
    if learnable_sink is not None:  # a call less without sinks (issue 12's host cost)
        _check_sink(call, learnable_sink)
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = torch.full((q.shape[0],), _int(call, "cache_seqlens", cache_seqlens), dtype=torch.int32,
                                   device=q.device)
    window_left, window_right = _capi.window_bounds(call, window_size)
    args = (q, k_cache, v_cache, k, v, cache_seqlens, page_table, learnable_sink,
            None if softmax_scale is None else float(softmax_scale), bool(causal), window_left, window_right,
            float(softcap), num_splits if type(num_splits) is int else _int(call, "num_splits", num_splits))
    plain = _plain_call((q, k_cache, v_cache, k, v, cache_seqlens, page_table, learnable_sink))
    # A plain call has nothing that requires grad in grad mode (_plain_call checked): the generator below runs
    # only otherwise (about 1 µs of host time, issue 12).
    if not plain and torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                     for t in (q, k_cache, v_cache, k, v, learnable_sink)):
        raise UnsupportedError(f"{call}: expected inputs that do not require grad, or torch.no_grad(): the "
                               f"KV-cache forward has no backward")
    if plain:
        # The op's dispatch (its in-place bookkeeping included) costs more host time than the call itself: the
        # caches' version counters are bumped here instead, as the op would after writing them.
        out, lse = _forward_kvcache_impl(*args, need_lse=bool(return_softmax_lse))
        if k is not None:
            _increment_version((k_cache, v_cache))
    else:
        out, lse = forward_kvcache_op(*args)
    return (out, lse) if return_softmax_lse else out
