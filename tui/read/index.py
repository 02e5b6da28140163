"""Reading the engine's binary index of events.jsonl (`mt.contract.eventindex`) into `Columns`.

One read of 64 bytes per event instead of JSON parsing; a sample of records (first, last and
evenly spaced ones) and every non-step event are checked against their lines, and an index
that disagrees with events.jsonl is ignored.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from mt.contract import door
from mt.contract.eventindex import FIELDS, HEADER, KIND_BAD, KIND_CODES, RECORD, index_path, kind_code, line_matches, read_header
from mt.contract.paths import RunPaths
from mt.contract.records import Rejected, parse_event
from tui.read.columns import COLS, Columns

SPOT_CHECKS = 16
_STEP = KIND_CODES["step"]
_COL = {name: FIELDS.index(name) for name in FIELDS}


def index_end(paths: RunPaths) -> int:
    """How far into events.jsonl the index reaches, from its header and last record (cheap); 0 if unusable."""
    try:
        size = os.stat(paths.events).st_size
        with door.open_file(index_path(paths.events)) as f:
            if read_header(f.read(HEADER.size)) is None:
                return 0
            n = (os.fstat(f.fileno()).st_size - HEADER.size) // RECORD.size
            if n <= 0:
                return 0
            f.seek(HEADER.size + (n - 1) * RECORD.size)
            end = int(RECORD.unpack(f.read(RECORD.size))[0])
    except (OSError, ValueError):
        return 0
    return end if end <= size else 0


def load_index(paths: RunPaths) -> tuple[Columns, int] | None:
    """Columns and events of the part of events.jsonl the index covers, and where it ends."""
    try:
        size = os.stat(paths.events).st_size
        with door.open_file(index_path(paths.events)) as f:
            if read_header(f.read(HEADER.size)) is None:
                return None
            m = np.fromfile(f, dtype="<f8")     # one copy straight into the array
    except (OSError, ValueError):
        return None
    m = m[: m.size - m.size % len(FIELDS)].reshape(-1, len(FIELDS))   # a torn last record is left out
    # records for lines appended after our stat are left to the follower
    n = int(np.searchsorted(m[:, 0], size, side="right"))
    m = m[:n]
    if not n or not np.all(np.diff(m[:, 0]) > 0):
        return None
    starts = np.concatenate(([0.0], m[:-1, 0]))
    for i in sorted({round(v) for v in np.linspace(0, n - 1, SPOT_CHECKS).tolist()}):
        if not line_matches(paths.events, int(starts[i]), int(m[i, 0]), m[i].tobytes()):
            return None
    kind = m[:, _COL["kind"]]
    is_step = kind == _STEP
    cols = Columns(bad_lines=int(np.count_nonzero(kind == KIND_BAD)))
    rows = np.empty((int(np.count_nonzero(is_step)), len(COLS)), order="F")  # columns stay contiguous
    for j, c in enumerate(COLS):
        rows[:, j] = m[:, _COL[c]][is_step]
    cols.add_rows(rows)
    steps_before = np.cumsum(is_step)
    others = np.flatnonzero(~is_step & (kind != KIND_BAD))
    events = _events_at(paths, m, starts, others, steps_before)
    if events is None:
        return None
    cols.events = events
    return cols, int(m[-1, 0])


def _events_at(paths: RunPaths, m: np.ndarray, starts: np.ndarray, rows: np.ndarray,
               steps_before: np.ndarray) -> list[tuple[int, int, dict[str, Any]]] | None:
    """The non-step events, read from their lines (an eval's [eval] factory metrics live only there)."""
    out = []
    with door.open_file(paths.events) as f:
        for i in rows.tolist():
            start, k = int(starts[i]), int(steps_before[i])
            f.seek(start)
            ev = parse_event(f.read(int(m[i, 0]) - start))
            if kind_code(ev) != m[i, _COL["kind"]]:
                return None
            if isinstance(ev, Rejected):
                return None           # the index disagrees with the parser: not to be trusted
            out.append((start, k, ev))
    return out
