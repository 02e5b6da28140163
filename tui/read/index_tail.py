"""The newest state of a big run from the end of the engine's index, without numpy.

What a first frame needs: the newest steps (the last TAIL_RECORDS records) and the newest
event of each non-step kind, which the index header names. Status and incidents come from
their own files (the follower reads them). Best loss then covers only the tail
(`best_loss_partial`); the full read from the index follows.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from mt.contract import door
from mt.contract.eventindex import HEADER, KIND_BAD, KIND_CODES, RECORD, index_path, kind_code, line_matches, read_header
from mt.contract.paths import RunPaths
from mt.contract.records import Rejected, parse_event
from tui.state.runstate import BulkResult, RunState, new_state, reduce_event

TAIL_RECORDS = 4096
_STEP = KIND_CODES["step"]
Record = tuple[float, ...]


def quick_read_index(run_dir: Path) -> BulkResult | None:
    """The newest state from the index (no plot history); None without a usable index."""
    paths = RunPaths(Path(run_dir))
    try:
        st = os.stat(paths.events)
        with door.open_file(index_path(paths.events)) as f:
            picked = _pick_records(f)
    except (OSError, ValueError):
        return None
    if picked is None:
        return None
    # records of lines written after our stat wait for the follower
    items = sorted((i, start, rec) for i, (start, rec) in picked.items() if rec[0] <= st.st_size)
    if not items:
        return None
    i, start, rec = items[-1]
    if not line_matches(paths.events, start, int(rec[0]), RECORD.pack(*rec)):
        return None          # an index of other contents: the caller reads the slow way
    state = _state_from_index(paths, items)
    if state is None:
        return None
    state.best_loss_partial = items[0][0] > 0
    return BulkResult(state, None, int(rec[0]), st.st_ino, int(rec[0]))


def _pick_records(f: BinaryIO) -> dict[int, tuple[int, Record]] | None:
    """Record number -> (start of its line, record): the tail and the newest of each kind."""
    newest = read_header(f.read(HEADER.size))
    if newest is None:
        return None
    n = (os.fstat(f.fileno()).st_size - HEADER.size) // RECORD.size
    if n <= 0:
        return None
    picked = _records(f, max(0, n - TAIL_RECORDS), n)
    for p in newest:
        if 0 < p <= n and p - 1 not in picked:
            picked.update(_records(f, p - 1, p))
    return picked


def _records(f: BinaryIO, a: int, b: int) -> dict[int, tuple[int, Record]]:
    """Records a..b-1 with the start of each one's line (the end of the record before)."""
    lo = max(0, a - 1)
    f.seek(HEADER.size + lo * RECORD.size)
    data = f.read((b - lo) * RECORD.size)
    recs = list(RECORD.iter_unpack(data[: len(data) - len(data) % RECORD.size]))
    out = {}
    for k, rec in enumerate(recs):
        i = lo + k
        if i >= a:
            out[i] = (int(recs[k - 1][0]) if k else 0, rec)
    return out


def _state_from_index(paths: RunPaths, items: list[tuple[int, int, Record]]) -> RunState | None:
    """Fold the picked records in file order; steps from their records, except the newest,
    whose line carries what the header shows beyond the plotted columns (step time, MFU).

    The fold itself is reduce_event's, as in bulk.replay; this one reads index records (each
    checked by the parser, None at the first that disagrees) and loads no numpy for a first frame."""
    state = new_state(paths.root)
    last_step = max((i for i, _, rec in items if rec[1] == _STEP), default=None)
    with door.open_file(paths.events) as f:
        for i, start, rec in items:
            kind = int(rec[1])
            if kind == KIND_BAD:
                state.bad_lines += 1
                continue
            if kind == _STEP and i != last_step:
                ev = parse_event({"kind": "step", "step": rec[2], "t": rec[3], "loss": rec[4],
                                  "lr": rec[5], "grad_norm": rec[6], "tokens_per_s": rec[7]})
            else:
                f.seek(start)
                ev = parse_event(f.read(int(rec[0]) - start))
                if kind_code(ev) != kind:
                    return None
            if isinstance(ev, Rejected):
                return None           # the index disagrees with the parser: not to be trusted
            reduce_event(state, ev)
    return state
