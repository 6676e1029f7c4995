"""Exceptions fa4 raises. Each C status (fa4_status in include/fa4/fa4.h) has its class; every class also
derives from the built-in exception a Python caller would expect, so `except ValueError` catches bad input."""


class Error(Exception):
    """Base class of every fa4 error. `status` is the C layer's fa4_status code (None for Python-side errors
    that have no C status, such as a missing library)."""

    status = None


class InvalidArgumentError(Error, ValueError):
    """The call is malformed: shapes, strides, dtypes, devices or option values (FA4_ERROR_INVALID_ARGUMENT)."""

    status = 1


class UnsupportedError(Error, NotImplementedError):
    """The call is well formed, but no backend of this build of libfa4 can run it (FA4_ERROR_UNSUPPORTED)."""

    status = 2


class CudaError(Error, RuntimeError):
    """The CUDA runtime reported an error (FA4_ERROR_CUDA)."""

    status = 3


class InternalError(Error, RuntimeError):
    """A bug in fa4 (FA4_ERROR_INTERNAL): please report it with the message."""

    status = 4


class LibraryNotFoundError(Error, OSError):
    """libfa4.so could not be found or loaded, or it does not match this package's view of the C ABI."""


ERROR_BY_STATUS = {cls.status: cls for cls in (InvalidArgumentError, UnsupportedError, CudaError, InternalError)}
