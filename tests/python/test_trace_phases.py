"""bench/trace_phases.py: the reader against the committed recorded trace, and the phases of a synthetic tile whose
durations are known (no GPU: the trace files are data)."""

import importlib.util
import pathlib
import struct
from collections import defaultdict

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("trace_phases", REPO / "bench" / "trace_phases.py")
trace_phases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trace_phases)

KIND = {name: i for i, name in enumerate(trace_phases.KINDS)}
WAIT = {name: i for i, name in enumerate(trace_phases.WAITS)}


def write_trace(path, slices, capacity=32):
    """A version-1 trace file (trace.cpp's write_trace) of one CTA with the writers' event lists `slices`."""
    def text(s):
        return struct.pack("<I", len(s)) + s.encode()
    body = b"FA4TRACE" + struct.pack("<I", 1) + text("kernel") + text("shape")
    body += struct.pack("<III", 1, len(slices), capacity)
    body += b"".join(text(name) for name, _ in slices)
    body += struct.pack(f"<{len(slices)}I", *[len(events) for _, events in slices])
    for _, events in slices:
        rows = [trace_phases.EVENT.pack(t, 0, KIND[k], 0, arg) for t, k, arg in events]
        body += b"".join(rows) + bytes(trace_phases.EVENT.size * (capacity - len(rows)))
    path.write_bytes(body)


def phases_of(path, writer):
    _kernel, _shape, ctas, names, slice_of, dropped = trace_phases.read_trace(str(path))
    assert dropped == 0
    phases = defaultdict(list)
    for c in range(ctas):
        trace_phases.tile_phases(slice_of(c, names.index(writer)), phases)
    return phases


def test_a_synthetic_tiles_phases_are_its_event_gaps(tmp_path):
    tile = [(0, "tile_begin", 0), (10, "wait_begin", WAIT["q"]), (30, "wait_end", 0),
            (40, "wait_begin", WAIT["k"]), (45, "wait_end", 0), (100, "s_issue", 0), (150, "s_done", 0),
            (160, "softmax_begin", 0), (200, "softmax_end", 0), (220, "s_issue", 1), (230, "pv_issue", 0),
            (300, "s_done", 1), (310, "softmax_begin", 1), (400, "softmax_end", 1), (420, "pv_done", 0),
            (450, "pv_issue", 1), (480, "pv_done", 1), (490, "epilogue_begin", 0),
            (500, "wait_begin", WAIT["barrier"]), (507, "wait_end", 0), (600, "epilogue_end", 0),
            (610, "tile_end", 0)]
    second = [(t + 700, k, a) for t, k, a in tile]
    gap_wait = [(640, "wait_begin", WAIT["tile_slot"]), (670, "wait_end", 0)]
    path = tmp_path / "t.fa4trace"
    write_trace(path, [("load", []), ("consumer 0", tile + gap_wait + second)], capacity=64)
    p = phases_of(path, "consumer 0")
    assert p["steps (K/V tiles) per tile"] == [2, 2]
    assert p["tile, begin to end"] == [610, 610]
    assert p["begin -> first S issued"] == [100, 100]
    assert p["  of which waiting for q"] == [20, 20]
    assert p["  of which waiting for k"] == [5, 5]
    assert p["first S issued -> landed"] == [50, 50]
    assert p["first softmax"] == [40, 40]
    assert p["first softmax end -> second S issued"] == [20, 20]
    assert p["steady step (S issue -> next S / last P.V issue)"] == [230, 230]  # 220 -> the last P.V at 450
    assert p["last softmax end -> last P.V issued"] == [50, 50]
    assert p["last P.V issued -> landed"] == [30, 30]
    assert p["epilogue (begin to end)"] == [110, 110]
    assert p["  of which waiting for barrier"] == [7, 7]
    assert p["gap: tile end -> next tile begin"] == [90]
    assert p["gap: waiting for tile_slot"] == [30]


def test_the_recorded_forward_trace_reads_whole_tiles():
    p = phases_of(REPO / "tests" / "data" / "trace-sm90-fwd-d128-1cta.fa4trace", "consumer 0")
    # b = 1, 4096 keys in 128-key tiles: every work tile walks all 32 (trace.md; test_trace_recorded.cpp).
    assert p["steps (K/V tiles) per tile"] and set(p["steps (K/V tiles) per tile"]) == {32}
    assert all(0 < ns < 10_000 for ns in p["epilogue (begin to end)"])


def test_a_file_that_is_not_a_trace_is_refused(tmp_path):
    path = tmp_path / "x.fa4trace"
    path.write_bytes(b"NOTATRACE")
    with pytest.raises(SystemExit, match="bad magic"):
        trace_phases.read_trace(str(path))
