"""Bad input raises an exception of the status's class whose message names the argument; nothing crashes."""

import ctypes.util

import numpy as np
import pytest

import fa4
from fa4 import _capi


def arrays(q_shape=(1, 4, 2, 8), kv_shape=(1, 6, 2, 8), dtype=np.float32):
    return np.zeros(q_shape, dtype), np.zeros(kv_shape, dtype), np.zeros(kv_shape, dtype)


# (id, arguments of fa4.attention, exception class, argument the message names)
NUMPY_BAD_CALLS = [
    ("head_dim_mismatch", lambda: (arrays(kv_shape=(1, 6, 2, 4)), {}), fa4.InvalidArgumentError, "k"),
    ("v_seqlen_mismatch", lambda: ((*arrays()[:2], np.zeros((1, 5, 2, 8), np.float32)), {}),
     fa4.InvalidArgumentError, "v"),
    ("gqa_heads_not_dividing", lambda: (arrays(q_shape=(1, 4, 3, 8)), {}), fa4.InvalidArgumentError, "k"),
    ("batch_mismatch", lambda: (arrays(kv_shape=(2, 6, 2, 8)), {}), fa4.InvalidArgumentError, "k"),
    ("rank_3", lambda: ((np.zeros((4, 2, 8), np.float32), *arrays()[1:]), {}), fa4.InvalidArgumentError, "q"),
    ("rank_5", lambda: ((np.zeros((1, 1, 4, 2, 8), np.float32), *arrays()[1:]), {}), fa4.InvalidArgumentError, "q"),
    ("integer_dtype", lambda: (arrays(dtype=np.int32), {}), fa4.InvalidArgumentError, "q"),
    ("mixed_dtypes", lambda: ((arrays()[0], *arrays(dtype=np.float64)[1:]), {}), fa4.InvalidArgumentError, "k"),
    ("head_dim_too_large", lambda: (arrays((1, 4, 2, 300), (1, 6, 2, 300)), {}), fa4.UnsupportedError, "q"),
    ("causal_with_right_window", lambda: (arrays(), dict(causal=True, window_size=(4, 2))),
     fa4.InvalidArgumentError, "options.window_right"),
    ("window_below_minus_one", lambda: (arrays(), dict(window_size=(-3, 0))), fa4.InvalidArgumentError,
     "options.window_left"),
    ("window_not_a_pair", lambda: (arrays(), dict(window_size=3)), fa4.InvalidArgumentError, "window_size"),
    ("window_float", lambda: (arrays(), dict(window_size=(1.5, 2))), fa4.InvalidArgumentError, "window_size"),
    ("negative_softcap", lambda: (arrays(), dict(softcap=-1.0)), fa4.InvalidArgumentError, "options.softcap"),
    ("nan_scale", lambda: (arrays(), dict(softmax_scale=float("nan"))), fa4.InvalidArgumentError,
     "options.softmax_scale"),
    ("scale_not_a_number", lambda: (arrays(), dict(softmax_scale="big")), fa4.InvalidArgumentError,
     "softmax_scale"),
]


@pytest.mark.parametrize("make_call,error_class,argument", [c[1:] for c in NUMPY_BAD_CALLS],
                         ids=[c[0] for c in NUMPY_BAD_CALLS])
def test_numpy_bad_input_names_the_argument(expect_error, make_call, error_class, argument):
    (q, k, v), options = make_call()
    expect_error(error_class, argument, fa4.attention, q, k, v, **options)


def test_error_classes_are_builtin_subclasses():
    assert issubclass(fa4.InvalidArgumentError, ValueError)
    assert issubclass(fa4.UnsupportedError, NotImplementedError)
    assert issubclass(fa4.CudaError, RuntimeError) and issubclass(fa4.InternalError, RuntimeError)
    assert all(issubclass(c, fa4.Error) for c in (fa4.InvalidArgumentError, fa4.UnsupportedError, fa4.CudaError,
                                                   fa4.InternalError, fa4.LibraryNotFoundError))


def test_message_says_expected_and_got(expect_error):
    message = expect_error(fa4.InvalidArgumentError, "k", fa4.attention, *arrays(kv_shape=(1, 6, 2, 4)))
    assert "expected" in message and "got" in message and "[1, 6, 2, 4]" in message


def test_backward_bad_lse_names_it(expect_error):
    q, k, v = arrays()
    out, lse = fa4.attention(q, k, v, return_lse=True)
    expect_error(fa4.InvalidArgumentError, "lse", fa4.attention_backward, out, q, k, v, out, lse[:, :1])
    expect_error(fa4.InvalidArgumentError, "lse", fa4.attention_backward, out, q, k, v, out, lse[0])
    expect_error(fa4.InvalidArgumentError, "dout", fa4.attention_backward, out[:, :2], q, k, v, out, lse)


def test_supports_reports_reasons_without_raising():
    assert fa4.supports(*arrays())
    support = fa4.supports(*arrays(kv_shape=(1, 6, 2, 4)))
    assert not support and "'k'" in support.reason
    assert not fa4.supports(np.zeros((2, 2)), *arrays()[1:])


@pytest.fixture
def reload_library(monkeypatch):
    """Lets a test point FA4_LIBRARY elsewhere; the real library is found again afterwards."""
    _capi.library.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    _capi.library.cache_clear()


def test_missing_library_says_where_it_looked_and_what_to_do(reload_library, tmp_path):
    missing = tmp_path / "nowhere" / "libfa4.so"
    reload_library.setenv("FA4_LIBRARY", str(missing))
    with pytest.raises(fa4.LibraryNotFoundError) as info:
        fa4.attention(*arrays())
    message = str(info.value)
    assert str(missing) in message and "FA4_LIBRARY" in message and "pip install" in message
    assert isinstance(info.value, OSError)


def test_a_library_that_is_not_libfa4_is_refused(reload_library):
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to load")
    reload_library.setenv("FA4_LIBRARY", libm if "/" in libm else f"/lib/x86_64-linux-gnu/{libm}")
    with pytest.raises(fa4.LibraryNotFoundError, match="lacks the C ABI function"):
        fa4.attention(*arrays())
