"""fa4: FlashAttention-4 attention (forward and backward) through libfa4's C ABI.

    fa4.attention(q, k, v, ...)          numpy arrays, CPU backend (float32/16/64, ml_dtypes.bfloat16)
    fa4.attention_backward(dout, ...)    its gradients
    fa4.flash_attn_func(q, k, v, ...)    torch tensors, FlashAttention's signature, autograd, torch.compile
    fa4.flash_attn_varlen_func(...)      the same for sequences packed without padding (CPU tensors today)
    fa4.flash_attn_with_kvcache(...)     decode against a contiguous or paged KV cache, forward only (CPU today)
    fa4.supports(q, k, v, ...)           whether this build can run a call, and if not why

torch is imported only when a torch entry point is first used, so numpy-only use works without it; the custom
ops torch.ops.fa4.forward / torch.ops.fa4.backward are registered then (on first access to flash_attn_func). The
library is found through $FA4_LIBRARY, else the copy bundled by `pip install`, else <repo>/build/libfa4.so."""

from typing import NamedTuple

from . import _capi
from .errors import (CudaError, Error, InternalError, InvalidArgumentError, LibraryNotFoundError,
                     UnsupportedError)

__all__ = ["attention", "attention_backward", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "supports", "Support", "library_path",
           "library_version", "Error", "InvalidArgumentError", "UnsupportedError", "CudaError", "InternalError",
           "LibraryNotFoundError"]

_TORCH_ENTRY_POINTS = ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache")
_NUMPY_ENTRY_POINTS = ("attention", "attention_backward")


def __getattr__(name):
    # Import numpy / torch on first use of an entry point that needs it, then cache it as a plain attribute.
    if name in _TORCH_ENTRY_POINTS:
        from . import _torch as module
    elif name in _NUMPY_ENTRY_POINTS:
        from . import _numpy as module
    else:
        raise AttributeError(f"module 'fa4' has no attribute '{name}'")
    value = getattr(module, name)
    globals()[name] = value
    return value


def library_path():
    """Path of the libfa4 in use (loads it if needed; raises LibraryNotFoundError if there is none)."""
    return _capi.library().path


def library_version():
    return _capi.library().version


class Support(NamedTuple):
    """Whether a call can run; reason says why not (empty when ok). Truthy when ok."""

    ok: bool
    reason: str

    def __bool__(self):
        return self.ok


def supports(q, k, v, *, backward=False, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
             deterministic=False):
    """Whether this build of libfa4 can run the forward (or backward) pass on these numpy arrays or torch
    tensors with these options; never computes anything. A GPU run without CUDA kernels answers
    Support(False, "...no CUDA attention kernels..."). Malformed inputs answer False with the reason too."""
    call = "fa4.supports"
    try:
        if type(q).__module__.split(".")[0] == "torch":
            from ._torch import describe
            arrays = (q, k, v)
        else:
            from ._numpy import as_input, describe
            arrays = [as_input(call, name, x) for name, x in (("q", q), ("k", k), ("v", v))]
        inputs = [describe(call, name, a) for name, a in zip(("q", "k", "v"), arrays)]
    except InvalidArgumentError as e:
        return Support(False, str(e))
    options = _capi.options(call, softmax_scale, causal, *_capi.window_bounds(call, window_size), softcap,
                            deterministic)
    status, reason = _capi.supports(_capi.BACKWARD if backward else _capi.FORWARD, *inputs, options)
    return Support(status == 0, reason)
