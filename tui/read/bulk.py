"""Opening a big events.jsonl fast: bulk read into state + history, and a tail-first quick read.

events.jsonl stays the source of truth. A bulk read starts from the engine's binary index
(`tui.read.index`, the one big-run index: every run mt writes has it) and scans only the bytes
it does not cover. A run without one (a copy without it, an index the writer gave up on) is
scanned whole, and its first frame comes from events.jsonl's tail; the viewer writes nothing.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from mt.contract import door
from mt.contract.checkpoints import best, newest
from mt.contract.jsonl import MAX_LINE_BYTES, next_newline
from mt.contract.paths import RunPaths
from mt.contract.records import Record, Rejected, RunStart, Step, parse_event
from mt.contract.status import read_status
from tui.read.columns import _NONSTEP, _STEP, CHUNK, COLS, Columns, ColumnScanner
from tui.read.index import index_end, load_index
from tui.state.runseries import RunSeries
from tui.state.runstate import BulkResult, CheckpointInfo, RunState, new_state, reduce_event, reduce_rows, reduce_step

QUICK_TAIL_BYTES = 2 << 20       # steps a quick read parses (~5000 step lines)
QUICK_SCAN_BYTES = 16 << 20      # how far back a quick read looks for other events (~40k steps)
_RUN_START = b'"kind":"run_start"'


# ---------------------------------------------------------------- replay into state and series


def replay(run_dir: Path, cols: Columns, keep_series: bool = True) -> tuple[RunState, RunSeries | None]:
    """Fold columns and events, in file order, into a fresh state (and plot history)."""
    st = new_state(run_dir)
    series = RunSeries() if keep_series else None
    m = cols.matrix()
    prev = 0
    for _, k, ev in cols.events:
        if isinstance(ev, (RunStart, Step)):
            # a new attempt (or a script's step with extra metrics, kept as an event) follows
            # the step rows before it: apply those in one go
            _apply_rows(st, series, m[prev:k])
            prev = k
        if series is not None and isinstance(ev, Step):
            series.add_step(ev)
        elif series is not None:
            series.add_event(ev)
        reduce_event(st, ev)
    _apply_rows(st, series, m[prev:])
    st.bad_lines = cols.bad_lines
    return st, series


def _apply_rows(st: RunState, series: RunSeries | None, rows: np.ndarray) -> None:
    if not len(rows):
        return
    x = rows[:, 0]
    if series is not None:
        plotted = rows if np.isfinite(x).all() else rows[np.isfinite(x)]  # as RunSeries.add_step
        for j, name in enumerate(COLS[1:], start=1):
            getattr(series, name).extend(plotted[:, 0], plotted[:, j])
    reduce_rows(st, *rows.T)


def fix_recent(st: RunState, path: Path, end: int, tail_bytes: int = 64 * 1024) -> None:
    """Fill the ETA window and per-step extras from the newest attempt's last step lines (the
    columns lack t), looking back (up to QUICK_SCAN_BYTES) past non-step lines after them."""
    steps: list[Step] = []
    stop = end
    while stop > 0 and end - stop < QUICK_SCAN_BYTES:
        start = max(0, stop - tail_bytes)
        tail_bytes = min(2 * tail_bytes, CHUNK)    # each read bounded, however long the lines
        with door.open_file(path) as f:
            f.seek(start)
            data = f.read(stop - start)
        nl = data.find(b"\n")
        first = 0 if not start else nl + 1 if nl >= 0 else len(data)   # a cut line: the next window's
        steps, new_attempt = _newest_steps(data[first:])
        if steps or new_attempt:
            break
        # back past the cut line; inside a line longer than the window, past the window (never a step)
        stop = start + first if first < len(data) else start
    st.recent.clear()
    best, best_step, n, state = st.best_loss, st.best_loss_step, st.n_steps, st.state
    for ev in steps[-st.recent.maxlen:]:
        reduce_step(st, ev)
    st.best_loss, st.best_loss_step, st.n_steps, st.state = best, best_step, n, state


def _newest_steps(data: bytes) -> tuple[list[Step], bool]:
    """The step records of whole lines after the last run_start among them, and whether one was there."""
    steps: list[Step] = []
    new_attempt = False
    for line in data.split(b"\n"):
        if _STEP in line:
            ev = parse_event(line)
            if isinstance(ev, Step):
                steps.append(ev)
        elif _RUN_START in line and isinstance(parse_event(line), RunStart):
            steps, new_attempt = [], True    # the steps before it are an older attempt's
    return steps, new_attempt


# ---------------------------------------------------------------- entry points


def bulk_read(run_dir: Path, keep_series: bool = True) -> BulkResult:
    """Exact state (and full plot history) of events.jsonl up to its current size: from the
    engine's index as far as it reaches, the rest scanned."""
    paths = RunPaths(Path(run_dir))
    st = os.stat(paths.events)
    hit = load_index(paths)
    cols, start = hit if hit else (Columns(), 0)
    # One thread, in chunks: worker processes were tried and bought little on 2 cores, at the
    # price of spawn's re-import of __main__ in every embedding.
    end = ColumnScanner().scan(paths.events, start, st.st_size, cols)
    state, series = replay(paths.root, cols, keep_series)
    fix_recent(state, paths.events, end)
    return BulkResult(state, series, end, st.st_ino, start)


def has_fast_start(paths: RunPaths, bulk_min_bytes: int) -> bool:
    """A bulk read would start from the engine's index leaving less than `bulk_min_bytes` of
    events.jsonl unscanned."""
    try:
        size = os.stat(paths.events).st_size
    except OSError:
        return False
    return size - index_end(paths) < bulk_min_bytes


def quick_read(run_dir: Path, tail_bytes: int | None = None, keep_series: bool = False) -> BulkResult:
    """`quick_state` packaged like a bulk read, so a follower can adopt it and carry on."""
    paths = RunPaths(Path(run_dir))
    st = os.stat(paths.events)
    state, end, series = _quick(run_dir, tail_bytes, keep_series)
    return BulkResult(state, series, end, st.st_ino, 0)


def quick_state(run_dir: Path, tail_bytes: int | None = None) -> tuple[RunState, int]:
    """The latest state fast, and the offset it covers (see `_quick`)."""
    state, end, _ = _quick(run_dir, tail_bytes, keep_series=False)
    return state, end


def _quick(run_dir: Path, tail_bytes: int | None, keep_series: bool) -> tuple[RunState, int, RunSeries | None]:
    """The latest state fast, and the offset it covers: steps from the last `tail_bytes`,
    other events from the last QUICK_SCAN_BYTES (plus the run_start at the head of the file).

    Best loss then covers only the tail (`best_loss_partial`); incidents come from
    incidents.jsonl, which mirrors the engine's; a checkpoint older than the window is taken
    from the checkpoints folder.
    """
    paths = RunPaths(Path(run_dir))
    size = os.stat(paths.events).st_size
    tail_start = _line_start(paths.events, max(0, size - (QUICK_TAIL_BYTES if tail_bytes is None else tail_bytes)))
    win_start = _line_start(paths.events, max(0, tail_start - QUICK_SCAN_BYTES))
    cols = Columns()
    cols.events = [(off, 0, ev) for off, ev in _nonstep_events(paths.events, win_start, tail_start)]
    end = ColumnScanner().scan(paths.events, tail_start, size, cols)
    if win_start > 0 and not any(isinstance(ev, RunStart) for _, _, ev in cols.events):
        cols.events[:0] = _head_run_start(paths, win_start)
    state, series = replay(paths.root, cols, keep_series=keep_series)
    fix_recent(state, paths.events, end)
    state.best_loss_partial = tail_start > 0
    if state.last_checkpoint is None and win_start > 0:
        state.last_checkpoint = newest_checkpoint_dir(paths)
        kept = best(paths.checkpoints)   # the best kept, from their manifests as the engine marks them
        state.best_checkpoints, state.best_metric = {b.step: b.value for b in kept}, kept[0].metric if kept else None
    return state, end, series


def newest_checkpoint_dir(paths: RunPaths) -> CheckpointInfo | None:
    """The newest checkpoint on disk whose manifest and sizes check out, as every listing counts
    it (for a quick read that saw no checkpoint event)."""
    found = newest(paths.checkpoints, "sizes")
    if found.path is None or found.step is None:
        return None
    try:
        return CheckpointInfo(step=found.step, path=str(found.path), t=found.path.stat().st_mtime)
    except OSError:
        return None


def _line_start(path: Path, offset: int) -> int:
    """The first line boundary at or after offset."""
    if offset <= 0:
        return 0
    with door.open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(offset - 1)
        nl = next_newline(f, size)        # in chunks: the line may be over-long
        return size if nl < 0 else nl + 1


def _head_run_start(paths: RunPaths, win_start: int) -> list[tuple[int, int, Record]]:
    """The current attempt's run_start when it lies before the scanned window."""
    with door.open_file(paths.events) as f:
        first = parse_event(f.readline(MAX_LINE_BYTES + 1))
    if isinstance(first, RunStart) and read_status(paths.root).attempt in (None, first.attempt):
        return [(0, 0, first)]
    # a later attempt started before the window: find it the slow way (every non-step event)
    return [(off, 0, ev) for off, ev in _nonstep_events(paths.events, 0, win_start)]


def _nonstep_events(path: Path, start: int, end: int) -> Iterator[tuple[int, Record]]:
    """Every non-step event in [start, end), found without parsing the step lines."""
    pos = start
    with door.open_file(path) as f:
        f.seek(start)
        carry = b""
        while pos < end:
            data = carry + f.read(min(CHUNK, end - pos - len(carry)))
            if not data:
                break
            cut = data.rfind(b"\n") + 1 if pos + len(data) < end else len(data)
            if cut == 0 and len(data) > MAX_LINE_BYTES:
                nl = next_newline(f, end)    # inside an over-long line: no event, skip to its end
                if nl < 0:
                    break
                pos, carry = nl + 1, b""
                f.seek(pos)
                continue
            seen: set[int] = set()
            for m in _NONSTEP.finditer(data, 0, cut):
                ls = data.rfind(b"\n", 0, m.start()) + 1
                if ls in seen:
                    continue
                seen.add(ls)
                le = data.find(b"\n", m.start())
                ev = parse_event(data[ls:le if le >= 0 else len(data)])
                if not isinstance(ev, (Rejected, Step)):
                    yield pos + ls, ev
            pos += cut
            carry = data[cut:]
            if cut == 0:
                break
