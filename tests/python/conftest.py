"""Shared set-up of the Python tests: the fa4 package (installed, or this checkout's python/), torch when it
is installed, and a summary of the per-call overheads the GPU tests measure."""

import importlib.util
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Test the installed package if there is one; otherwise this checkout's source (it then finds
# <repo>/build/libfa4.so, or $FA4_LIBRARY).
if importlib.util.find_spec("fa4") is None:
    sys.path.insert(0, str(REPO / "python"))

MEASUREMENTS = []  # (label, value, unit), printed at the end of the run


@pytest.fixture
def measurements():
    """measurements(label, value, unit): a figure to print in the run's summary (e.g. per-call overhead)."""
    return lambda label, value, unit: MEASUREMENTS.append((label, value, unit))


def pytest_terminal_summary(terminalreporter):
    if MEASUREMENTS:
        terminalreporter.section("fa4 measurements")
        for label, value, unit in MEASUREMENTS:
            terminalreporter.write_line(f"{label}: {value:.1f} {unit}")


def pytest_report_header():
    import fa4
    try:
        library = f"{fa4.library_path()} (version {fa4.library_version()})"
    except fa4.LibraryNotFoundError as e:
        library = f"NOT FOUND: {e}"
    return [f"fa4 package: {pathlib.Path(fa4.__file__).parent}", f"libfa4: {library}"]


@pytest.fixture
def rng():
    import numpy as np
    return np.random.default_rng(20240605)


@pytest.fixture
def expect_error():
    """expect_error(error_class, argument, call, *args, **kwargs): the call raises error_class and its message
    names 'argument'; returns the message."""
    def check(error_class, argument, call, *args, **kwargs):
        with pytest.raises(error_class) as info:
            call(*args, **kwargs)
        message = str(info.value)
        assert f"'{argument}'" in message, message
        return message
    return check
