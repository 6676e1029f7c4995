#!/usr/bin/env python3
"""Where a forward work tile's time goes, per consumer writer, from a trace.fa4trace file of `fa4 trace`
(a -DFA4_TRACE=ON build): the mean and median of each phase between a tile's events, in ns.

    python3 bench/trace_phases.py TRACE.fa4trace [...]

Phases (consumer events, src/trace/format.hpp): the gap between a tile's end and the next tile's begin, and its
wait for the tile's index (tile_slot); begin to the first S issued, and the waits inside it (q; k with the turn); the first S; the first
softmax; to the second S; steady steps (S issue to the next S issue, or to the last P·V issue); the last softmax
to the last P·V; the last P·V; the epilogue, and the waits inside it (stage_free: the previous tile's O store
reading its staging rows; barrier: the warpgroup's barrier before the store). The file format is trace.cpp's (write_trace), version 1."""

import statistics
import struct
import sys
from collections import defaultdict

KINDS = ["tile_begin", "tile_end", "wait_begin", "wait_end", "tma_issue", "s_issue", "s_done", "softmax_begin",
         "softmax_end", "rescale_taken", "rescale_skipped", "pv_issue", "pv_done", "epilogue_begin", "epilogue_end",
         "dq_add", "rescale_rows"]
WAITS = ["q", "kv", "k", "v", "tile_slot", "stage_free", "dq_turn", "dq_buffer", "barrier", "peer"]
EVENT = struct.Struct("<QHBBi")  # t_ns, sm, kind, pad, arg (format.hpp's Event, 16 bytes)


def read_trace(path):
    data = open(path, "rb").read()
    if data[:8] != b"FA4TRACE":
        sys.exit(f"{path}: not a trace file (bad magic)")
    pos = 8

    def u32():
        nonlocal pos
        (v,) = struct.unpack_from("<I", data, pos)
        pos += 4
        return v

    def text():
        nonlocal pos
        n = u32()
        pos += n
        return data[pos - n:pos].decode()

    if (version := u32()) != 1:
        sys.exit(f"{path}: format version {version}, this script reads 1")
    kernel, shape = text(), text()
    ctas, writers, capacity = u32(), u32(), u32()
    names = [text() for _ in range(writers)]
    counts = struct.unpack_from(f"<{ctas * writers}I", data, pos)
    pos += 4 * ctas * writers

    def slice_of(cta, writer):
        start = pos + (cta * writers + writer) * capacity * EVENT.size
        n = min(counts[cta * writers + writer], capacity)
        return [EVENT.unpack_from(data, start + i * EVENT.size) for i in range(n)]

    dropped = sum(max(c - capacity, 0) for c in counts)
    return kernel, shape, ctas, names, slice_of, dropped


def tile_phases(events, phases):
    """Adds one consumer slice's per-tile phase durations (ns) to `phases`."""
    tile = None
    last_end = None
    wait_from = None
    waits = defaultdict(int)  # inside the current window: begin -> first S, or the gap before a tile
    for t, _sm, kind, _pad, arg in events:
        k = KINDS[kind] if kind < len(KINDS) else "?"
        if k == "wait_begin":
            wait_from = (t, WAITS[arg] if 0 <= arg < len(WAITS) else str(arg))
        elif k == "wait_end" and wait_from is not None:
            waits[wait_from[1]] += t - wait_from[0]
            wait_from = None
        if k == "tile_begin":
            if last_end is not None:  # the gap holds the wait for the next tile's index
                phases["gap: tile end -> next tile begin"].append(t - last_end)
                phases["gap: waiting for tile_slot"].append(waits.get("tile_slot", 0))
            tile = {"begin": t, "s": [], "s_done": [], "sm_begin": [], "sm_end": [], "pv": [], "pv_done": []}
            waits = defaultdict(int)
        elif tile is None:
            continue
        elif k == "s_issue":
            if not tile["s"]:
                tile["pre_waits"] = {what: waits.get(what, 0) for what in ("q", "k")}
            tile["s"].append(t)
        elif k in ("s_done", "pv_issue", "pv_done"):
            tile[k if k != "pv_issue" else "pv"].append(t)
        elif k == "softmax_begin":
            tile["sm_begin"].append(t)
        elif k == "softmax_end":
            tile["sm_end"].append(t)
        elif k == "epilogue_begin":
            tile[k] = t
            waits = defaultdict(int)
        elif k == "epilogue_end":
            tile[k] = t
            tile["epilogue_waits"] = {what: waits.get(what, 0) for what in ("stage_free", "barrier")}
        elif k == "tile_end":
            last_end = t
            waits = defaultdict(int)
            s, sm_b, sm_e, pv = tile["s"], tile["sm_begin"], tile["sm_end"], tile["pv"]
            if s and sm_e and pv and tile["pv_done"] and "epilogue_begin" in tile and "epilogue_end" in tile:
                phases["steps (K/V tiles) per tile"].append(len(s))
                phases["tile, begin to end"].append(t - tile["begin"])
                phases["begin -> first S issued"].append(s[0] - tile["begin"])
                for what, ns in tile.get("pre_waits", {}).items():
                    phases[f"  of which waiting for {what}"].append(ns)
                if tile["s_done"]:
                    phases["first S issued -> landed"].append(tile["s_done"][0] - s[0])
                phases["first softmax"].append(sm_e[0] - sm_b[0])
                if len(s) > 1:
                    phases["first softmax end -> second S issued"].append(s[1] - sm_e[0])
                for i in range(1, min(len(s), len(sm_b), len(sm_e))):
                    phases["steady step (S issue -> next S / last P.V issue)"].append(
                        (s[i + 1] if i + 1 < len(s) else pv[-1]) - s[i])
                    phases["steady softmax"].append(sm_e[i] - sm_b[i])
                phases["last softmax end -> last P.V issued"].append(pv[-1] - sm_e[-1])
                phases["last P.V issued -> landed"].append(tile["pv_done"][-1] - pv[-1])
                phases["last P.V landed -> epilogue begin"].append(tile["epilogue_begin"] - tile["pv_done"][-1])
                phases["epilogue (begin to end)"].append(tile["epilogue_end"] - tile["epilogue_begin"])
                for what, ns in tile.get("epilogue_waits", {}).items():
                    phases[f"  of which waiting for {what}"].append(ns)
            tile = None


def main(paths):
    for path in paths:
        kernel, shape, ctas, names, slice_of, dropped = read_trace(path)
        print(f"{path}\n  {kernel} | {shape}")
        if dropped:
            print(f"  WARNING: {dropped} events were dropped (full slices): the phases cover the recorded ones")
        for w, name in enumerate(names):
            if not name.startswith("consumer"):
                continue
            phases = defaultdict(list)
            for c in range(ctas):
                tile_phases(slice_of(c, w), phases)
            print(f"  {name}: mean / median ns (count)")
            for what, v in phases.items():
                print(f"    {what:52s} {statistics.fmean(v):9.1f} {statistics.median(v):9.1f}  ({len(v)})")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
