"""fa4 on numpy arrays (the CPU backend): float32, float16, float64 and ml_dtypes.bfloat16."""

import ctypes

import numpy as np

from . import _capi
from .errors import InvalidArgumentError

_DTYPE_CODES = {"float32": _capi.F32, "float16": _capi.F16, "bfloat16": _capi.BF16, "float64": _capi.F64}
_RANK_LAYOUT = {4: "[batch, seqlen, heads, head_dim]", 3: "[batch, heads, seqlen_q]"}


def as_input(call, name, x, rank=4):
    """x as a numpy array fa4 can read: the given rank, native byte order, unit stride on the last dim (copied
    only when it is not so already, as FlashAttention does), strides in whole elements."""
    a = np.asarray(x)
    if a.ndim != rank:
        raise InvalidArgumentError(f"{call}: argument '{name}': expected rank {rank} ({_RANK_LAYOUT[rank]}), "
                                   f"got rank {a.ndim} (shape {list(a.shape)})")
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if (a.shape[-1] > 1 and a.strides[-1] != a.itemsize) or any(s % a.itemsize for s in a.strides):
        a = np.ascontiguousarray(a)
    return a


def describe(call, name, a):
    """The fa4_tensor of a numpy array from as_input (or allocated here)."""
    code = _DTYPE_CODES.get(a.dtype.name)
    if code is None:
        raise InvalidArgumentError(f"{call}: argument '{name}': expected dtype float32, float16, float64 or "
                                   f"bfloat16 (ml_dtypes), got {a.dtype}")
    if a.size == 0:  # numpy gives empty arrays zero strides; nothing is read, so describe them as contiguous
        return _capi.tensor(call, name, None, code, _capi.CPU, 0, a.shape, _contiguous_strides(a.shape))
    return _capi.tensor(call, name, a.ctypes.data, code, _capi.CPU, 0, a.shape, [s // a.itemsize for s in a.strides])


def _contiguous_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= max(size, 1)
    return strides


def _workspace(pass_, descriptors, options):
    """A host buffer of the size the pass asks for (None when it needs none): the buffer keeps it alive."""
    nbytes = _capi.workspace_size(pass_, *descriptors, options)
    if nbytes == 0:
        return None, None, 0
    buffer = np.empty(nbytes, np.uint8)
    return buffer, ctypes.c_void_p(buffer.ctypes.data), nbytes


def attention(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, return_lse=False):
    """softmax(softmax_scale · q kᵀ, masked, capped) v on the CPU backend.

    q: [batch, seqlen_q, heads, head_dim]; k, v: [batch, seqlen_k, heads_kv, head_dim] (heads % heads_kv == 0);
    any strides (the head_dim stride is made 1 by a copy if needed). causal is bottom-right aligned; window_size
    = (left, right), -1 or None = unbounded; softcap = 0 is off. Returns out (contiguous, q's dtype), and with
    return_lse=True also the float32 log-sum-exp [batch, heads, seqlen_q] (natural log; -inf for a fully masked
    row, whose output is 0)."""
    call = "fa4.attention"
    q, k, v = (as_input(call, name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    inputs = [describe(call, name, a) for name, a in (("q", q), ("k", k), ("v", v))]
    options = _capi.options(call, softmax_scale, causal, *_capi.window_bounds(call, window_size), softcap)
    out = np.empty(q.shape, q.dtype)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32)
    _buffer, workspace, workspace_bytes = _workspace(_capi.FORWARD, inputs, options)
    _capi.forward(*inputs, describe(call, "out", out), describe(call, "lse", lse), options, workspace,
                  workspace_bytes)
    return (out, lse) if return_lse else out


def attention_backward(dout, q, k, v, out, lse, *, softmax_scale=None, causal=False, window_size=(-1, -1),
                       softcap=0.0, deterministic=False):
    """(dq, dk, dv) of attention(q, k, v, ...) for the output gradient dout, from the forward's out and lse.
    The options must be the forward's."""
    call = "fa4.attention_backward"
    named = {"dout": dout, "q": q, "k": k, "v": v, "out": out}
    arrays = {name: as_input(call, name, x) for name, x in named.items()}
    arrays["lse"] = as_input(call, "lse", lse, rank=3)
    d = {name: describe(call, name, a) for name, a in arrays.items()}
    options = _capi.options(call, softmax_scale, causal, *_capi.window_bounds(call, window_size), softcap,
                            deterministic)
    grads = {name: np.empty(arrays[name].shape, arrays["q"].dtype) for name in ("q", "k", "v")}
    inputs = [d["q"], d["k"], d["v"]]
    _buffer, workspace, workspace_bytes = _workspace(_capi.BACKWARD, inputs, options)
    _capi.backward(*inputs, d["out"], d["dout"], d["lse"], *(describe(call, "d" + n, g) for n, g in grads.items()),
                   options, workspace, workspace_bytes)
    return grads["q"], grads["k"], grads["v"]
