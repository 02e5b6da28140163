"""Opening a big events.jsonl fast: a bulk column scan, a tail-first quick state, a sidecar cache.

events.jsonl stays the source of truth. The cache (`.mt-index/` in the run directory) holds the
numeric columns of the `step` events and the byte offsets of every other event, keyed by the
file's inode, a hash of its first bytes and the byte offset it covers; it is extended, not
rebuilt, when the file grew, and silently ignored when it does not match.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from engine.events import RunPaths, as_float, read_json, write_json_atomic
from tui.stream import CheckpointInfo, RunSeries, RunState, new_state, reduce_event, reduce_step

COLS = ("step", "loss", "lr", "grad_norm")
CHUNK = 16 << 20                 # bytes per read: bounds memory whatever the file size
CACHE_DIR = ".mt-index"
CACHE_VERSION = 1
HEAD_BYTES = 4096
QUICK_TAIL_BYTES = 2 << 20       # steps a quick read parses (~5000 step lines)
QUICK_SCAN_BYTES = 48 << 20      # how far back a quick read looks for other events
_NONSTEP = re.compile(rb'"kind":"(?!step")')
_STEP = b'"kind":"step"'
_VAL = rb'(?:"[^"]*"|[^,"{}\[\]]*)'


@dataclass
class Columns:
    """Step-event columns in file order, and the other events with their position among them."""

    rows: list[np.ndarray] = field(default_factory=list)          # blocks of shape (n, len(COLS))
    events: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)  # (offset, n_before, ev)
    n: int = 0
    bad_lines: int = 0

    def add_rows(self, block: np.ndarray) -> None:
        if len(block):
            self.rows.append(block)
            self.n += len(block)

    def matrix(self) -> np.ndarray:
        if not self.rows:
            return np.empty((0, len(COLS)))
        if len(self.rows) > 1:
            self.rows = [np.concatenate(self.rows)]
        return self.rows[0]


def _step_pattern(line: bytes) -> re.Pattern[bytes] | None:
    """A regex for step lines with the same key order as `line`, capturing COLS in COLS order."""
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    if not isinstance(ev, dict) or ev.get("kind") != "step" or not all(c in ev for c in COLS):
        return None
    parts = []
    last_wanted = max(list(ev).index(c) for c in COLS)
    for key, value in list(ev.items())[: last_wanted + 1]:
        if isinstance(value, (dict, list)):
            return None
        k = b'"' + re.escape(key.encode()) + b'":'
        if key == "kind":
            parts.append(k + b'"step"')
        elif key in COLS:
            # a named group per wanted column; "nan"/"inf" come quoted, numbers bare
            parts.append(k + b'"?(?P<' + key.encode() + rb'>[^,"{}\[\]]*)"?')
        else:
            parts.append(k + _VAL)
    # stop after the last wanted key: the rest of the line need not be matched, only counted
    return re.compile(rb"\{" + b",".join(parts))


def _to_float(values: list[bytes]) -> np.ndarray:
    try:
        return np.fromiter(map(float, values), dtype=np.float64, count=len(values))
    except ValueError:  # null or another non-number: the slow, forgiving way
        return np.array([as_float(v.decode("utf-8", "replace")) if v != b"null" else np.nan for v in values])


class ColumnScanner:
    """Scans byte ranges of events.jsonl into `Columns`, with a JSON fallback for odd lines."""

    def __init__(self) -> None:
        self.pattern: re.Pattern[bytes] | None = None

    def scan(self, path: Path, start: int, end: int, out: Columns) -> int:
        """Scan complete lines of [start, end); returns the offset after the last complete line."""
        pos = start
        with open(path, "rb") as f:
            f.seek(start)
            carry = b""
            while pos + len(carry) < end:
                data = carry + f.read(min(CHUNK, end - pos - len(carry)))
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    if len(data) >= end - pos:
                        break           # a half-written last line: leave it for the follower
                    carry = data
                    continue
                self._chunk(data, cut, pos, out)
                pos += cut
                carry = data[cut:]
        return pos

    def _chunk(self, data: bytes, cut: int, base: int, out: Columns) -> None:
        seg_start = 0
        seen_lines: set[int] = set()
        for m in _NONSTEP.finditer(data, 0, cut):
            ls = data.rfind(b"\n", 0, m.start()) + 1
            if ls in seen_lines:
                continue        # a nested "kind" inside an event already taken (run_start config)
            seen_lines.add(ls)
            le = data.find(b"\n", m.start())
            self._steps(data, seg_start, ls, out)
            try:
                ev = json.loads(data[ls:le])
            except ValueError:
                ev = None
            if isinstance(ev, dict):
                if ev.get("kind") == "step":
                    self._steps(data, ls, le + 1, out)
                else:
                    out.events.append((base + ls, out.n, ev))
            else:
                out.bad_lines += 1
            seg_start = le + 1
        self._steps(data, seg_start, cut, out)

    def _steps(self, data: bytes, a: int, b: int, out: Columns) -> None:
        """Step lines of data[a:b] (nothing else but garbage lies there)."""
        if b <= a:
            return
        n_step = data.count(_STEP, a, b)
        n_lines = data.count(b"\n", a, b)
        if n_step == 0 and n_lines == 0:
            return
        if self.pattern is None and n_step:
            first = data.find(_STEP, a, b)
            ls = data.rfind(b"\n", 0, first) + 1
            self.pattern = _step_pattern(data[ls:data.find(b"\n", first)])
        if self.pattern is not None and n_step == n_lines:
            found = self.pattern.findall(data, a, b)
            if len(found) == n_step:
                self._add(found, out)
                return
        self._slow(data, a, b, out)

    def _add(self, found: list[tuple[bytes, ...]], out: Columns) -> None:
        names = list(self.pattern.groupindex)          # group order = key order of the line
        block = np.empty((len(found), len(COLS)))
        for j, name in enumerate(names):
            block[:, COLS.index(name)] = _to_float([row[j] for row in found])
        out.add_rows(block)

    def _slow(self, data: bytes, a: int, b: int, out: Columns) -> None:
        rows = []
        for line in data[a:b].split(b"\n"):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                out.bad_lines += 1
                continue
            if not isinstance(ev, dict):
                out.bad_lines += 1
            elif ev.get("kind") == "step":
                rows.append([as_float(ev.get(c)) for c in COLS])
            else:
                if rows:
                    out.add_rows(np.array(rows))
                    rows = []
                out.events.append((-1, out.n, ev))
        if rows:
            out.add_rows(np.array(rows))
        # learn the key order of the last step line seen (the writer may have changed it)
        last = data.rfind(_STEP, a, b)
        if last >= 0:
            ls = data.rfind(b"\n", 0, last) + 1
            le = data.find(b"\n", last)
            self.pattern = _step_pattern(data[ls:le if le >= 0 else b]) or self.pattern


# ---------------------------------------------------------------- replay into state and series


def replay(run_dir: Path, cols: Columns, keep_series: bool = True) -> tuple[RunState, RunSeries | None]:
    """Fold columns and events, in file order, into a fresh state (and plot history)."""
    st = new_state(run_dir)
    series = RunSeries() if keep_series else None
    m = cols.matrix()
    prev = 0
    for _, k, ev in cols.events:
        _apply_rows(st, series, m[prev:k])
        prev = k
        if series is not None:
            if ev.get("kind") == "run_start":
                series.truncate_after(float(ev.get("start_step") or 0))
            elif ev.get("kind") == "eval":
                series.val_loss.append(float(ev.get("step") or 0), as_float(ev.get("val_loss")))
        reduce_event(st, ev)
    _apply_rows(st, series, m[prev:])
    st.bad_lines = cols.bad_lines
    return st, series


def _apply_rows(st: RunState, series: RunSeries | None, rows: np.ndarray) -> None:
    if not len(rows):
        return
    x = rows[:, 0]
    if series is not None:
        for j, name in enumerate(COLS[1:], start=1):
            getattr(series, name).extend(x, rows[:, j])
    loss = rows[:, 1]
    fin = np.isfinite(loss)
    if fin.any():
        i = int(np.argmin(np.where(fin, loss, np.inf)))
        if st.best_loss is None or loss[i] < st.best_loss:
            st.best_loss, st.best_loss_step = float(loss[i]), int(x[i])
    last = rows[-1]
    st.n_steps += len(rows)
    st.step = int(last[0])
    st.loss, st.lr, st.grad_norm = (float(v) for v in last[1:4])
    if st.state == "starting":
        st.state = "running"


def fix_recent(st: RunState, path: Path, end: int, tail_bytes: int = 64 * 1024) -> None:
    """Fill the ETA window and per-step extras from the last step lines (the columns lack t)."""
    start = max(0, end - tail_bytes)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    lines = data.split(b"\n")[1 if start else 0:]
    steps = []
    for line in lines:
        if _STEP in line:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("kind") == "step":
                steps.append(ev)
    st.recent.clear()
    best, best_step, n, state = st.best_loss, st.best_loss_step, st.n_steps, st.state
    for ev in steps[-st.recent.maxlen:]:
        reduce_step(st, ev)
    st.best_loss, st.best_loss_step, st.n_steps, st.state = best, best_step, n, state


# ---------------------------------------------------------------- the sidecar cache


def _head_hash(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha1(f.read(HEAD_BYTES)).hexdigest()


def load_cache(paths: RunPaths) -> tuple[Columns, int] | None:
    """Columns and the offset they cover, if the cache matches events.jsonl as it is now."""
    d = paths.root / CACHE_DIR
    try:
        meta = json.loads((d / "index.json").read_text())
        st = os.stat(paths.events)
        if (meta.get("version") != CACHE_VERSION or meta["ino"] != st.st_ino
                or meta["end"] > st.st_size or meta["head"] != _head_hash(paths.events)):
            return None
        m = np.load(d / f"cols-{meta['token']}.npy")
        if m.shape != (meta["n"], len(COLS)):
            return None
        cols = Columns(n=0, bad_lines=int(meta["bad_lines"]))
        cols.add_rows(m)
        cols.events = _read_events_at(paths.events, meta["events"])
        if cols.events is None:
            return None
        return cols, int(meta["end"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _read_events_at(path: Path, index: list[list[int]]) -> list[tuple[int, int, dict[str, Any]]] | None:
    out = []
    with open(path, "rb") as f:
        for off, k in index:
            f.seek(off)
            try:
                ev = json.loads(f.readline())
            except ValueError:
                return None
            out.append((off, k, ev))
    return out


def save_cache(paths: RunPaths, cols: Columns, end: int) -> bool:
    """Write the cache (columns file first, index last: the index is what makes it valid)."""
    if any(off < 0 for off, _, _ in cols.events):
        return False  # events parsed on the slow path carry no offset: not worth caching
    d = paths.root / CACHE_DIR
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        token = os.urandom(4).hex()
        tmp = d / f".cols-{token}.npy"
        np.save(tmp, cols.matrix())
        os.replace(tmp, d / f"cols-{token}.npy")
        st = os.stat(paths.events)
        write_json_atomic(d / "index.json", {
            "version": CACHE_VERSION, "ino": st.st_ino, "head": _head_hash(paths.events), "end": end,
            "n": cols.n, "bad_lines": cols.bad_lines, "token": token,
            "events": [[off, k] for off, k, _ in cols.events]})
        for old in d.glob("cols-*.npy"):
            if old.name != f"cols-{token}.npy":
                old.unlink(missing_ok=True)
        return True
    except OSError:
        return False  # a read-only run directory: the viewer works without a cache


# ---------------------------------------------------------------- entry points


@dataclass
class BulkResult:
    state: RunState
    series: RunSeries | None
    end: int            # events.jsonl bytes covered
    ino: int
    from_cache: int     # of which came from the cache
    cached: bool        # a cache was written


def bulk_read(run_dir: Path, keep_series: bool = True, write_cache: bool = True,
              min_cache_bytes: int | None = None) -> BulkResult:
    """Exact state (and full plot history) of events.jsonl up to its current size.

    The cache is (re)written when at least `min_cache_bytes` (default: the bulk threshold)
    had to be scanned.
    """
    if min_cache_bytes is None:
        from tui import stream
        min_cache_bytes = stream.BULK_MIN_BYTES
    paths = RunPaths(Path(run_dir))
    st = os.stat(paths.events)
    hit = load_cache(paths)
    cols, start = hit if hit else (Columns(), 0)
    end = ColumnScanner().scan(paths.events, start, st.st_size, cols)
    state, series = replay(paths.root, cols, keep_series)
    fix_recent(state, paths.events, end)
    cached = False
    if write_cache and end - start >= min_cache_bytes:
        cached = save_cache(paths, cols, end)
    return BulkResult(state, series, end, st.st_ino, start, cached)


def has_cache(paths: RunPaths) -> bool:
    """A cache that matches events.jsonl exists (cheap: reads the index only)."""
    try:
        meta = json.loads((paths.root / CACHE_DIR / "index.json").read_text())
        st = os.stat(paths.events)
        return (meta.get("version") == CACHE_VERSION and meta["ino"] == st.st_ino
                and meta["end"] <= st.st_size and meta["head"] == _head_hash(paths.events))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def quick_read(run_dir: Path, tail_bytes: int | None = None) -> BulkResult:
    """`quick_state` packaged like a bulk read, so a follower can adopt it and carry on."""
    paths = RunPaths(Path(run_dir))
    st = os.stat(paths.events)
    state, end = quick_state(run_dir, tail_bytes)
    return BulkResult(state, None, end, st.st_ino, 0, False)


def quick_state(run_dir: Path, tail_bytes: int | None = None) -> tuple[RunState, int]:
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
    if win_start > 0 and not any(ev.get("kind") == "run_start" for _, _, ev in cols.events):
        cols.events[:0] = _head_run_start(paths, win_start)
    state, _ = replay(paths.root, cols, keep_series=False)
    fix_recent(state, paths.events, end)
    state.best_loss_partial = tail_start > 0
    if state.last_checkpoint is None and win_start > 0:
        state.last_checkpoint = _newest_checkpoint_dir(paths)
    return state, end


def _line_start(path: Path, offset: int) -> int:
    """The first line boundary at or after offset."""
    if offset <= 0:
        return 0
    with open(path, "rb") as f:
        f.seek(offset - 1)
        return offset - 1 + len(f.readline())


def _head_run_start(paths: RunPaths, win_start: int) -> list[tuple[int, int, dict[str, Any]]]:
    """The current attempt's run_start when it lies before the scanned window."""
    with open(paths.events, "rb") as f:
        try:
            first = json.loads(f.readline())
        except ValueError:
            first = None
    status = read_json(paths.status) or {}
    if isinstance(first, dict) and first.get("kind") == "run_start" and \
            status.get("attempt") in (None, first.get("attempt")):
        return [(0, 0, first)]
    # a later attempt started before the window: find it the slow way (every non-step event)
    return [(off, 0, ev) for off, ev in _nonstep_events(paths.events, 0, win_start)]


def _newest_checkpoint_dir(paths: RunPaths) -> CheckpointInfo | None:
    best = None
    try:
        for d in paths.checkpoints.glob("step-*"):
            tail = d.name[5:]
            if d.is_dir() and tail.isdigit() and (best is None or int(tail) > best[0]):
                best = (int(tail), d)
    except OSError:
        return None
    if best is None:
        return None
    return CheckpointInfo(step=best[0], path=str(best[1]), t=best[1].stat().st_mtime, reason="")


def _nonstep_events(path: Path, start: int, end: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every non-step event in [start, end), found without parsing the step lines."""
    pos = start
    with open(path, "rb") as f:
        f.seek(start)
        carry = b""
        while pos < end:
            data = carry + f.read(min(CHUNK, end - pos - len(carry)))
            if not data:
                break
            cut = data.rfind(b"\n") + 1 if pos + len(data) < end else len(data)
            seen: set[int] = set()
            for m in _NONSTEP.finditer(data, 0, cut):
                ls = data.rfind(b"\n", 0, m.start()) + 1
                if ls in seen:
                    continue
                seen.add(ls)
                le = data.find(b"\n", m.start())
                try:
                    ev = json.loads(data[ls:le if le >= 0 else len(data)])
                except ValueError:
                    continue
                if isinstance(ev, dict) and ev.get("kind") != "step":
                    yield pos + ls, ev
            pos += cut
            carry = data[cut:]
            if cut == 0:
                break
