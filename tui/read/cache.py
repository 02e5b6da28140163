"""The viewer's sidecar cache of a big events.jsonl (`.mt-index/` in the run directory).

It holds the step columns and the byte offsets of every other event, keyed by the file's
inode, a hash of its first bytes and the offset it covers. events.jsonl stays the source of
truth: a cache that does not match is ignored, one that covers a prefix is extended.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from mt.contract import door
from mt.contract.events import JSON_ERRORS
from mt.contract.jsonl import MAX_LINE_BYTES, write_json_atomic
from mt.contract.paths import RunPaths
from mt.contract.records import Record, Rejected, Step, parse_event
from tui.read.columns import COLS, Columns

CACHE_DIR = ".mt-index"
CACHE_VERSION = 2
HEAD_BYTES = 4096


def has_cache(paths: RunPaths) -> bool:
    """A cache that matches events.jsonl exists (cheap: reads the index only)."""
    try:
        meta = door.read_json(paths.root / CACHE_DIR / "index.json")
        st = os.stat(paths.events)
        return (meta.get("version") == CACHE_VERSION and meta["ino"] == st.st_ino
                and meta["end"] <= st.st_size and meta["head"] == _head_hash(paths.events))
    except (OSError, KeyError, TypeError, AttributeError, *JSON_ERRORS):
        return False


def _head_hash(path: Path) -> str:
    with door.open_file(path) as f:
        return hashlib.sha1(f.read(HEAD_BYTES)).hexdigest()


def load_cache(paths: RunPaths) -> tuple[Columns, int] | None:
    """Columns and the offset they cover, if the cache matches events.jsonl as it is now."""
    d = paths.root / CACHE_DIR
    try:
        meta = door.read_json(d / "index.json")
        st = os.stat(paths.events)
        if (meta.get("version") != CACHE_VERSION or meta["ino"] != st.st_ino
                or meta["end"] > st.st_size or meta["head"] != _head_hash(paths.events)):
            return None
        with door.open_file(d / f"cols-{meta['token']}.npy") as f:
            m = np.load(f)      # allow_pickle stays False: never unpickles
        if m.shape != (meta["n"], len(COLS)):
            return None
        cols = Columns(n=0, bad_lines=int(meta["bad_lines"]))
        cols.add_rows(m)
        cols.events = _read_events_at(paths.events, meta["events"])
        if cols.events is None:
            return None
        return cols, int(meta["end"])
    except (OSError, KeyError, TypeError, AttributeError, *JSON_ERRORS):
        return None


def _read_events_at(path: Path, index: list[list[int]]) -> list[tuple[int, int, Record]] | None:
    out = []
    with door.open_file(path) as f:
        for off, k in index:
            f.seek(off)
            ev = parse_event(f.readline(MAX_LINE_BYTES + 1))
            if isinstance(ev, Rejected) or isinstance(ev, Step) and ev.is_row:
                return None       # the cache points at a line that is not an event: stale
            out.append((off, k, ev))
    return out


def save_cache(paths: RunPaths, cols: Columns, end: int) -> bool:
    """Write the cache (columns file first, index last: the index is what makes it valid)."""
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
