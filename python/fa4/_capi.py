"""libfa4's C ABI (include/fa4/fa4.h) through ctypes: finding and loading the library, its structs, and the
calls wrapped so that a failing status becomes the matching exception carrying fa4_last_error()'s message.

Nothing here knows numpy or torch: callers describe their arrays with `tensor(...)`."""

import ctypes
import functools
import math
import operator
import os
import pathlib
import struct

from .errors import ERROR_BY_STATUS, InternalError, InvalidArgumentError, LibraryNotFoundError

# fa4_dtype, fa4_device, fa4_pass (fa4.h).
F32, F16, BF16, F64 = 0, 1, 2, 3
CPU, CUDA = 0, 1
FORWARD, BACKWARD = 0, 1

LIBRARY_ENV_VAR = "FA4_LIBRARY"
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
BUNDLED_LIBRARY = _PACKAGE_DIR / "_lib" / "libfa4.so"  # placed there by setup.py when the wheel is built
REPO_BUILD_LIBRARY = _PACKAGE_DIR.parent.parent / "build" / "libfa4.so"  # running from a checkout


class Tensor(ctypes.Structure):
    """fa4_tensor: rank 4 [batch, seqlen, heads, head_dim], rank 3 (the LSE) or rank 1 (attention sinks),
    strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


if struct.calcsize("@Piiii4q4q") != ctypes.sizeof(Tensor) or Tensor.shape.offset != 24:
    raise ImportError("fa4: the packed fa4_tensor layout does not match the Tensor structure on this platform")


class Options(ctypes.Structure):
    """fa4_options, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("has_softmax_scale", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("softcap", ctypes.c_float),
        ("exp2_emulated_fraction", ctypes.c_float),
        ("rescale_threshold", ctypes.c_float),
        ("deterministic", ctypes.c_int32),
        ("sinks", ctypes.POINTER(Tensor)),
        ("dsinks", ctypes.POINTER(Tensor)),
        ("num_splits", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("validate_device_metadata", ctypes.c_int32),
    ]


class Varlen(ctypes.Structure):
    """fa4_varlen: the offsets of a variable-length batch (pointers into int32 arrays where the tensors live)."""

    _fields_ = [
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int64),
    ]


class KvCache(ctypes.Structure):
    """fa4_kvcache: a KV cache's metadata (int32 arrays) and the keys/values to append (or NULL). k_new and v_new
    are packed fa4_tensors (tensor() below), pointed at in place: the structure keeps the bytes alive, and no
    Tensor structure is built per call (issue 12's host cost)."""

    _fields_ = [
        ("cache_seqlens", ctypes.c_void_p),
        ("page_table", ctypes.c_void_p),
        ("max_pages", ctypes.c_int64),
        ("k_new", ctypes.c_char_p),  # const fa4_tensor*
        ("v_new", ctypes.c_char_p),
    ]


_TENSOR_P = ctypes.c_char_p  # a packed fa4_tensor (tensor() below) or None
_VARLEN_P = ctypes.POINTER(Varlen)
_OPTIONS_P = ctypes.POINTER(Options)
_KVCACHE_P = ctypes.POINTER(KvCache)
_SIGNATURES = {  # name: (restype, argtypes)
    "fa4_version": (ctypes.c_char_p, []),
    "fa4_last_error": (ctypes.c_char_p, []),
    "fa4_options_init": (None, [ctypes.c_void_p]),
    "fa4_forward": (ctypes.c_int, [_TENSOR_P] * 5 + [_OPTIONS_P, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
    "fa4_backward": (ctypes.c_int, [_TENSOR_P] * 9 + [_OPTIONS_P, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
    "fa4_forward_varlen": (ctypes.c_int, [_TENSOR_P] * 5 + [_VARLEN_P, _OPTIONS_P, ctypes.c_void_p, ctypes.c_size_t,
                                                             ctypes.c_void_p]),
    "fa4_backward_varlen": (ctypes.c_int, [_TENSOR_P] * 9 + [_VARLEN_P, _OPTIONS_P, ctypes.c_void_p, ctypes.c_size_t,
                                                              ctypes.c_void_p]),
    "fa4_forward_kvcache": (ctypes.c_int, [_TENSOR_P] * 5 + [_KVCACHE_P, _OPTIONS_P, ctypes.c_void_p, ctypes.c_size_t,
                                                               ctypes.c_void_p]),
    "fa4_supports_kvcache": (ctypes.c_int, [_TENSOR_P] * 3 + [_KVCACHE_P, _OPTIONS_P, ctypes.c_char_p, ctypes.c_size_t]),
    "fa4_workspace_size": (ctypes.c_int, [ctypes.c_int, _TENSOR_P, _TENSOR_P, _TENSOR_P, _OPTIONS_P,
                                          ctypes.POINTER(ctypes.c_size_t)]),
    "fa4_supports": (ctypes.c_int, [ctypes.c_int, _TENSOR_P, _TENSOR_P, _TENSOR_P, _OPTIONS_P, ctypes.c_char_p,
                                    ctypes.c_size_t]),
    "fa4_workspace_size_varlen": (ctypes.c_int, [ctypes.c_int, _TENSOR_P, _TENSOR_P, _TENSOR_P, _VARLEN_P,
                                                 _OPTIONS_P, ctypes.POINTER(ctypes.c_size_t)]),
}


def library_candidates():
    """Where libfa4 is looked for, in order. An explicit FA4_LIBRARY is the only candidate, so that a typo in
    it fails loudly instead of silently loading another copy."""
    explicit = os.environ.get(LIBRARY_ENV_VAR)
    if explicit:
        path = pathlib.Path(explicit)
        return [path / "libfa4.so" if path.is_dir() else path]
    return [BUNDLED_LIBRARY, REPO_BUILD_LIBRARY]


class _Library:
    """The loaded library with its calls declared, and fa4_options_init's defaults kept as a template."""

    def __init__(self, path):
        self.path = path
        try:
            self.dll = ctypes.CDLL(str(path))
        except OSError as e:
            raise LibraryNotFoundError(f"fa4: cannot load {path}: {e}") from e
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                function = getattr(self.dll, name)
            except AttributeError:
                raise LibraryNotFoundError(f"fa4: {path} lacks the C ABI function {name} (not libfa4, or too old)")
            function.restype, function.argtypes = restype, argtypes
            setattr(self, name, function)
        self.default_options = self._default_options()
        self.version = self.fa4_version().decode()

    def _default_options(self):
        # fa4_options_init writes the library's own sizeof(fa4_options): give it room to spare, then require
        # that it is exactly the struct declared above (the C side refuses a smaller one anyway).
        buffer = ctypes.create_string_buffer(4 * ctypes.sizeof(Options))
        self.fa4_options_init(buffer)
        options = Options.from_buffer_copy(buffer)
        if options.struct_size != ctypes.sizeof(Options):
            raise LibraryNotFoundError(
                f"fa4: {self.path} has a {options.struct_size}-byte fa4_options, this package expects "
                f"{ctypes.sizeof(Options)} bytes: the library and the Python package are from different versions")
        return options

    def check(self, status):
        """Raise the exception of a failed call, with the C layer's message (it names the argument)."""
        if status != 0:
            message = self.fa4_last_error().decode(errors="replace")
            raise ERROR_BY_STATUS.get(status, InternalError)(message or f"fa4: call failed with status {status}")


@functools.cache
def library():
    """The loaded libfa4, found on first use (so that `import fa4` works before the library is built)."""
    candidates = library_candidates()
    for path in candidates:
        if path.exists():
            return _Library(path)
    looked = "\n".join(f"  {path}" for path in candidates)
    raise LibraryNotFoundError(
        f"fa4: cannot find libfa4.so; looked at:\n{looked}\n"
        f"Install the package with `pip install ./python` from the repository (it builds the library), build it "
        f"with `cmake -S . -B build && cmake --build build --target fa4`, or set {LIBRARY_ENV_VAR} to its path.")


_PACK_TENSOR = struct.Struct("@Piiii4q4q").pack  # fa4_tensor's layout (checked against Tensor at import)
PACK_TENSOR = _PACK_TENSOR  # (data, dtype, device, device_index, rank, 4 sizes, 4 strides) -> descriptor bytes
_ZEROS = (0, 0, 0, 0)


def tensor(call, name, data_ptr, dtype, device, device_index, shape, strides):
    """An fa4_tensor for an array of rank <= 4 (the C layer checks everything else and names `name`), packed into
    bytes: a call passes it as the struct's address, and packing costs about half of filling a ctypes Structure,
    per tensor of every call (issue 12's host cost)."""
    rank = len(shape)
    if rank == 4:
        return _PACK_TENSOR(data_ptr or 0, dtype, device, device_index, 4, *shape, *strides)
    if rank > 4:
        raise InvalidArgumentError(f"{call}: argument '{name}': expected rank 4 ([batch, seqlen, heads, head_dim]), "
                                   f"got rank {rank}")
    return _PACK_TENSOR(data_ptr or 0, dtype, device, device_index, rank, *(tuple(shape) + _ZEROS)[:4],
                        *(tuple(strides) + _ZEROS)[:4])


def tensor_struct(packed):
    """The Tensor structure of a packed descriptor (for struct fields that point at one: sinks, k_new, ...)."""
    return Tensor.from_buffer_copy(packed)


def window_bounds(call, window_size):
    """(left, right) from FlashAttention's window_size: -1 (FA2/FA3) or None (FA4) means unbounded."""
    if type(window_size) is tuple and len(window_size) == 2 and type(window_size[0]) is int \
            and type(window_size[1]) is int:  # the common call (the default (-1, -1)): nothing to convert
        return window_size
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{call}: argument 'window_size': expected a pair (left, right), -1 or None for "
                                   f"unbounded, got {window_size!r}") from None
    bounds = []
    for side, value in (("left", left), ("right", right)):
        if value is None:
            value = -1
        if isinstance(value, bool) or not hasattr(value, "__index__"):  # ints, numpy ints; not floats
            raise InvalidArgumentError(f"{call}: argument 'window_size': expected integer bounds, got {side} = "
                                       f"{value!r}")
        bounds.append(operator.index(value))
    return tuple(bounds)


_OPTIONS_CACHE = {}  # the argument tuple -> its validated Options (no sinks: nothing per call in them)


def options(call, softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
            deterministic=False, sinks=None, dsinks=None, num_splits=0):
    """fa4_options from FlashAttention's keyword arguments, on top of the library's defaults; sinks, dsinks: rank-1
    fa4_tensor descriptors (kept alive by the returned struct); num_splits: split-KV ranges (0: the backend's
    choice). Without sinks the struct is built once per distinct argument tuple and shared (callers pass it by
    reference to the library, which only reads it): building it was several microseconds of every call's host
    time (issue 12)."""
    # Cached only for plain Python values (a tensor or numpy scalar may change, or convert differently): the key
    # is what the struct is built from, so two tuples that compare equal build the same struct.
    if sinks is not None or dsinks is not None or not (
            (softmax_scale is None or type(softmax_scale) in (int, float)) and type(softcap) in (int, float)
            and type(causal) is bool and type(deterministic) is bool and type(num_splits) is int
            and type(window_left) is int and type(window_right) is int):
        return _build_options(call, softmax_scale, causal, window_left, window_right, softcap, deterministic, sinks,
                              dsinks, num_splits)
    key = (softmax_scale, causal, window_left, window_right, softcap, deterministic, num_splits)
    try:
        return _OPTIONS_CACHE[key]
    except KeyError:
        pass
    o = _build_options(call, softmax_scale, causal, window_left, window_right, softcap, deterministic, None, None,
                       num_splits)
    if len(_OPTIONS_CACHE) >= 256:
        _OPTIONS_CACHE.clear()
    _OPTIONS_CACHE[key] = o
    return o


def _build_options(call, softmax_scale, causal, window_left, window_right, softcap, deterministic, sinks, dsinks,
                   num_splits):
    o = Options.from_buffer_copy(library().default_options)
    if softmax_scale is not None:
        o.has_softmax_scale = 1
        o.softmax_scale = _float(call, "softmax_scale", softmax_scale)
    o.causal = bool(causal)
    for name, value in (("window_left", window_left), ("window_right", window_right)):
        if not -2**63 <= value < 2**63:  # ctypes would wrap it silently
            raise InvalidArgumentError(f"{call}: argument 'window_size': expected bounds that fit int64, "
                                       f"got {name} = {value}")
        setattr(o, name, value)
    o.softcap = _float(call, "softcap", softcap)
    o.deterministic = bool(deterministic)
    if sinks is not None:
        o.sinks = ctypes.pointer(tensor_struct(sinks))
    if dsinks is not None:
        o.dsinks = ctypes.pointer(tensor_struct(dsinks))
    if isinstance(num_splits, bool) or not hasattr(num_splits, "__index__") or \
            not -2**31 <= operator.index(num_splits) < 2**31:  # ctypes would wrap it silently
        raise InvalidArgumentError(f"{call}: argument 'num_splits': expected an int32 integer, got {num_splits!r}")
    o.num_splits = operator.index(num_splits)
    return o


def _float(call, name, value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{call}: argument '{name}': expected a number, got {value!r}") from None
    if math.isfinite(value) and abs(value) > 3.4028234663852886e38:  # ctypes would round it to inf silently
        raise InvalidArgumentError(f"{call}: argument '{name}': expected a number in float32 range, got {value}")
    return value


def forward(q, k, v, out, lse, options, workspace_ptr=None, workspace_bytes=0, stream=None):
    lib = library()
    lib.check(lib.fa4_forward(q, k, v, out, lse,
                              ctypes.byref(options), workspace_ptr, workspace_bytes, stream))


def backward(q, k, v, out, dout, lse, dq, dk, dv, options, workspace_ptr=None, workspace_bytes=0, stream=None):
    lib = library()
    tensors = (q, k, v, out, dout, lse, dq, dk, dv)
    lib.check(lib.fa4_backward(*tensors, ctypes.byref(options), workspace_ptr, workspace_bytes, stream))


def forward_varlen(q, k, v, out, lse, varlen, options, workspace_ptr=None, workspace_bytes=0, stream=None):
    lib = library()
    lib.check(lib.fa4_forward_varlen(q, k, v, out, lse,
                                     ctypes.byref(varlen), ctypes.byref(options), workspace_ptr, workspace_bytes,
                                     stream))


def backward_varlen(q, k, v, out, dout, lse, dq, dk, dv, varlen, options, workspace_ptr=None, workspace_bytes=0,
                    stream=None):
    lib = library()
    tensors = (q, k, v, out, dout, lse, dq, dk, dv)
    lib.check(lib.fa4_backward_varlen(*tensors, ctypes.byref(varlen), ctypes.byref(options), workspace_ptr,
                                      workspace_bytes, stream))


def forward_kvcache(q, k_cache, v_cache, out, lse, kvcache, options, workspace_ptr=None, workspace_bytes=0,
                    stream=None):
    lib = library()
    lib.check(lib.fa4_forward_kvcache(q, k_cache, v_cache,
                                      out, lse, ctypes.byref(kvcache), ctypes.byref(options),
                                      workspace_ptr, workspace_bytes, stream))


def supports_kvcache(q, k_cache, v_cache, kvcache, options):
    """(status, reason), as supports() for forward_kvcache's arguments."""
    lib = library()
    reason = ctypes.create_string_buffer(1024)
    status = lib.fa4_supports_kvcache(q, k_cache, v_cache,
                                      ctypes.byref(kvcache), ctypes.byref(options), reason, len(reason))
    return status, reason.value.decode(errors="replace")


_WORKSPACE_CACHE = {}  # (pass, descriptors without data pointers, options bytes, the backward's A/B overrides) -> bytes


def workspace_size(pass_, q, k, v, options):
    """The workspace bytes the pass asks for. The library's answer is a function of the pass, the tensors' dtype,
    device, shape and strides, the options (never of the data pointers, which the packed descriptors carry
    in their first 8 bytes) and, for the backward, the FA4_BWD_DET_CHAINS and FA4_BWD_DET_ROTATED A/B overrides
    (the deterministic accumulator copies), so it is remembered per such key: a ctypes round trip was a quarter of
    the Python side of a decode call (issue 12's host cost)."""
    environ = os.environ
    overrides = (environ.get("FA4_BWD_DET_CHAINS"), environ.get("FA4_BWD_DET_ROTATED")) if pass_ == BACKWARD else None
    key = (pass_, q[8:], k[8:], v[8:], bytes(options), overrides)
    size = _WORKSPACE_CACHE.get(key)
    if size is None:
        size = _workspace_size(pass_, q, k, v, options)
        if len(_WORKSPACE_CACHE) >= 1024:
            _WORKSPACE_CACHE.clear()
        _WORKSPACE_CACHE[key] = size
    return size


def _workspace_size(pass_, q, k, v, options):
    lib = library()
    size = ctypes.c_size_t(0)
    lib.check(lib.fa4_workspace_size(pass_, q, k, v,
                                     ctypes.byref(options), ctypes.byref(size)))
    return size.value


def workspace_size_varlen(pass_, q, k, v, varlen, options):
    """The workspace bytes of a variable-length call (a function of the shapes, the packed row count, options and
    varlen's batch and max_seqlen_q; the metadata are not read)."""
    lib = library()
    size = ctypes.c_size_t(0)
    lib.check(lib.fa4_workspace_size_varlen(pass_, q, k, v, ctypes.byref(varlen), ctypes.byref(options),
                                            ctypes.byref(size)))
    return size.value


def supports(pass_, q, k, v, options):
    """(status, reason): status 0 when the pass can run on these inputs. Never launches, never raises for the
    inputs themselves (the reason says what is wrong)."""
    lib = library()
    reason = ctypes.create_string_buffer(1024)
    status = lib.fa4_supports(pass_, q, k, v, ctypes.byref(options),
                              reason, len(reason))
    return status, reason.value.decode(errors="replace")
