"""events.idx: a fixed-width binary index of events.jsonl, one 64-byte record per line.

Rank 0 appends a record after each event line, so a viewer loads a million steps with one
read instead of parsing 400 MB of JSON. events.jsonl stays the source of truth: readers check
records against the lines they point at and ignore an index that disagrees; the writer repairs
a torn or lagging index when it opens. The header also says which record is the newest of each
non-step kind, so the newest run_start, eval, checkpoint... are found without reading the rest.
Stdlib only (the viewer side imports it).
"""
from __future__ import annotations

import errno
import os
import struct
import sys
from pathlib import Path
from typing import Any

from mt.contract import door
from mt.contract.events import SCHEMA, SCHEMA_VERSION, T_MAX, T_MIN
from mt.contract.incident import IncidentLine
from mt.contract.records import Checkpoint, Eval, Record, Rejected, RunEnd, Step, parse_event

MAGIC = b"MTEVIDX1"
VERSION = 2
FIELDS = ("end", "kind", "step", "t", "loss", "lr", "grad_norm", "tokens_per_s")
RECORD = struct.Struct("<8d")
# kind codes; an eval's val_loss goes in the loss field (readers take an eval from its line: [eval] factory's
# metrics live only there, and evals are few)
KIND_CODES = {"step": 0, "run_start": 1, "eval": 2, "checkpoint": 3, "incident": 4, "control": 5, "run_end": 6}
NEWEST_KINDS = (1, 2, 3, 4, 5, 6)        # the header keeps 1 + the number of the newest record of each
# magic, version, fields per record, then NEWEST_KINDS' newest records (0 = none); as long as a record
HEADER = struct.Struct(f"<8sII{len(NEWEST_KINDS)}q")
assert HEADER.size == RECORD.size
KIND_OTHER = 7      # a valid event of a kind this version does not know
KIND_BAD = -1       # a line mt.contract.records rejects (counted by readers, never shown)
CATCH_UP_BYTES = 64 << 20   # the most events.jsonl the writer re-reads to repair its index


def index_path(events: Path) -> Path:
    """Where the index of an events file lives (beside it)."""
    return Path(events).with_suffix(".idx")


def encode(rec: Record | Rejected, end: int) -> bytes:
    """The record of one parsed line: `end` is the byte offset just past its newline."""
    kind = kind_code(rec)
    if kind == KIND_BAD:
        return RECORD.pack(end, KIND_BAD, *([float("nan")] * 6))
    step = loss = lr = gn = tps = None
    if isinstance(rec, Step):
        step, loss, lr, gn, tps = rec.step, rec.loss, rec.lr, rec.grad_norm, rec.tokens_per_s
    elif isinstance(rec, Eval):
        step, loss = rec.step, rec.val_loss
    elif isinstance(rec, (Checkpoint, IncidentLine, RunEnd)):
        step = rec.step
    return RECORD.pack(end, kind, *(record_float(v) for v in (step, rec.t, loss, lr, gn, tps)))


# a step's fields by the parser's rule (mt/contract/events.py SCHEMA), for the fast path below
_STEP_RULES = {f.rule for f in SCHEMA["step"]}
assert _STEP_RULES <= {"whole", "number", "values", "free"} and not any(f.lo for f in SCHEMA["step"]), \
    f"step_record cannot judge {_STEP_RULES}"
# a soft field's odd value is dropped, never the line's: nothing for the fast path to judge (the engine's whole epoch)
_JUDGED = tuple(f for f in SCHEMA["step"] if not f.soft)
_REAL = tuple(f.name for f in _JUDGED if f.rule == "number" and not f.nonneg)
_NONNEG = tuple(f.name for f in _JUDGED if f.rule == "number" and f.nonneg)
_WHOLE = tuple(f.name for f in _JUDGED if f.rule == "whole" and f.name != "step")
_TABLES = tuple(f.name for f in SCHEMA["step"] if f.rule == "values")
_NAN = float("nan")


def step_record(ev: dict[str, Any], end: int) -> bytes | None:
    """encode(parse_event(ev)) for a step event of plain values, without the parser (the index
    writer's per-step cost); None when a value needs the parser's judgement."""
    step, t = ev.get("step"), ev.get("t")
    if ev.get("kind") != "step" or ev.get("v") != SCHEMA_VERSION or type(step) is not int or not 0 <= step < 1 << 53:
        return None
    if type(t) is not float or not T_MIN <= t <= T_MAX:
        return None
    for key in _REAL:
        v = ev.get(key)
        if v is not None and type(v) is not float:
            return None
    for key in _NONNEG:
        v = ev.get(key)
        if v is not None and (type(v) is not float or v < 0):
            return None
    for key in _WHOLE:
        v = ev.get(key)
        if v is not None and (type(v) is not int or not 0 <= v < 1 << 63):
            return None
    for key in _TABLES:
        if ev.get(key) is not None:
            return None  # a script's extras: indexed as KIND_OTHER, by the parser
    return RECORD.pack(end, 0, step, t, record_float(ev.get("loss")), record_float(ev.get("lr")), record_float(ev.get("grad_norm")), record_float(ev.get("tokens_per_s")))


def kind_code(rec: Record | Rejected) -> int:
    """The index kind of a parsed line."""
    if isinstance(rec, Rejected):
        return KIND_BAD
    if isinstance(rec, Step) and not rec.is_row:
        return KIND_OTHER  # a script's own metrics live only in the line: readers parse it
    return KIND_CODES.get(rec.kind, KIND_OTHER)  # metrics, and kinds this version does not know


def record_float(v: float | None) -> float:
    # one NaN bit pattern: a -nan from the device must not make the record differ from its line's
    return _NAN if v is None or v != v else float(v)


def index_lines(data: bytes, base: int) -> bytes:
    """Records for the complete lines of `data`, which starts at byte `base` of the file."""
    out = []
    pos = base
    for line in data.split(b"\n")[:-1]:
        pos += len(line) + 1
        if line.strip():
            out.append(encode(parse_event(line), pos))
    return b"".join(out)


class IndexWriter:
    """Appends records to events.idx; stops for good after a failed write (a gap would lie)."""

    def __init__(self, path: Path, fd: int, n: int, newest: list[int]) -> None:
        self.path = path
        self._fd = fd
        self._n = n                  # records in the file
        self._newest = newest        # as in the header

    def add(self, ev: dict[str, Any], end: int) -> None:
        """Index the event just written, ending at byte `end`."""
        if self._fd < 0:
            return
        record = encode(parse_event(ev), end)
        try:
            self._append(record)
            self._n += 1
            kind = int(RECORD.unpack(record)[1])
            if kind in NEWEST_KINDS:   # rare (not steps): one more small write
                self._newest[NEWEST_KINDS.index(kind)] = self._n
                os.pwrite(self._fd, _header(self._newest), 0)
        except OSError as e:
            print(f"events index {self.path}: {e}; the viewer will read events.jsonl instead", file=sys.stderr)
            self.close()

    def add_lines(self, lines: list[bytes], rows: list[tuple[float, ...] | None], ends: list[int]) -> None:
        """Index several lines just written in one write: `rows` hold each record's values after
        its end offset, or None where the line needs the parser."""
        if self._fd < 0:
            return
        records = b"".join(RECORD.pack(end, *row) if row is not None else encode(parse_event(line), end)
                           for line, row, end in zip(lines, rows, ends))
        newest = list(self._newest)
        n = _note_newest(records, self._n, newest)
        try:
            self._append(records)
            self._n = n
            if newest != self._newest:  # rare (steps have no slot): the header names the newest of a kind
                self._newest = newest
                os.pwrite(self._fd, _header(self._newest), 0)
        except OSError as e:
            print(f"events index {self.path}: {e}; the viewer will read events.jsonl instead", file=sys.stderr)
            self.close()

    def _append(self, records: bytes) -> None:
        """Whole records or none: a full disk that takes part of a write leaves no partial record."""
        if os.write(self._fd, records) != len(records):
            os.ftruncate(self._fd, HEADER.size + self._n * RECORD.size)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _header(newest: list[int]) -> bytes:
    return HEADER.pack(MAGIC, VERSION, len(FIELDS), *newest)


def read_header(head: bytes) -> list[int] | None:
    """The newest-of-kind list of a header this version writes; None for anything else."""
    if len(head) != HEADER.size:
        return None
    fields = HEADER.unpack(head)
    return list(fields[3:]) if fields[:3] == (MAGIC, VERSION, len(FIELDS)) else None


def open_index(events: Path, catch_up_bytes: int = CATCH_UP_BYTES) -> IndexWriter | None:
    """The index of `events`, repaired to cover every complete line of it; None if that would
    mean re-reading more than `catch_up_bytes` (readers then scan the uncovered rest)."""
    path = index_path(events)
    try:
        size = os.stat(events).st_size
        fd = door.open_own(path, os.O_RDWR)   # a FIFO or a link there: no index, never a block
    except OSError as e:
        print(f"events index {path}: {e}; the viewer will read events.jsonl instead", file=sys.stderr)
        return None
    try:
        covered, n, newest = _repair(fd, events, size)
        if size - covered > catch_up_bytes:
            os.close(fd)
            return None
        if size > covered:
            with door.open_file(events) as f:
                f.seek(covered)
                data = f.read(size - covered)
            records = index_lines(data, covered)
            at = HEADER.size + n * RECORD.size
            n = _note_newest(records, n, newest)
            # header first: killed before the records land, it points past the end (see _newest_ok)
            os.pwrite(fd, _header(newest), 0)
            os.pwrite(fd, records, at)
        os.lseek(fd, 0, os.SEEK_END)
        return IndexWriter(path, fd, n, newest)
    except OSError as e:
        os.close(fd)
        print(f"events index {path}: {e}; the viewer will read events.jsonl instead", file=sys.stderr)
        return None


def _note_newest(records: bytes, n: int, newest: list[int]) -> int:
    """Update `newest` with records numbered from n on; returns the new record count."""
    for kind, in struct.iter_unpack("<8xd48x", records):
        n += 1
        if kind in NEWEST_KINDS:
            newest[NEWEST_KINDS.index(int(kind))] = n
    return n


def _repair(fd: int, events: Path, size: int) -> tuple[int, int, list[int]]:
    """Cut a torn record; start over when the index does not match events.jsonl. Returns the
    byte of events.jsonl the index covers up to, its record count and newest-of-kind list."""
    isize = os.fstat(fd).st_size
    n = max(0, (isize - HEADER.size) // RECORD.size)
    newest = read_header(os.pread(fd, HEADER.size, 0))
    ok = newest is not None
    end = 0
    if ok and n:
        last = _raw_record(fd, n - 1)
        prev = RECORD.unpack(_raw_record(fd, n - 2))[0] if n > 1 else 0
        end = int(RECORD.unpack(last)[0])
        ok = end <= size and line_matches(events, int(prev), end, last)
    if not ok:
        os.ftruncate(fd, 0)
        os.pwrite(fd, _header([0] * len(NEWEST_KINDS)), 0)
        return 0, 0, [0] * len(NEWEST_KINDS)
    os.ftruncate(fd, HEADER.size + n * RECORD.size)
    if not _newest_ok(fd, n, newest):
        # killed between a record and its header update: count again (rare, one read)
        newest = [0] * len(NEWEST_KINDS)
        _note_newest(os.pread(fd, n * RECORD.size, HEADER.size), 0, newest)
        os.pwrite(fd, _header(newest), 0)
    return end, n, newest


def _newest_ok(fd: int, n: int, newest: list[int]) -> bool:
    """Every newest-of-kind entry points at a record of that kind, and no later record is one.

    Live, the header is written after the record; catching up, before the records: either way
    a kill in between leaves the last record newer than the header, or the header past the end.
    """
    for kind, p in zip(NEWEST_KINDS, newest):
        if p > n or (p and RECORD.unpack(_raw_record(fd, p - 1))[1] != kind):
            return False
    last_kind = RECORD.unpack(_raw_record(fd, n - 1))[1] if n else None
    return last_kind not in NEWEST_KINDS or newest[NEWEST_KINDS.index(int(last_kind))] == n


def _raw_record(fd: int, i: int) -> bytes:
    return os.pread(fd, RECORD.size, HEADER.size + i * RECORD.size)


def line_matches(events: Path, start: int, end: int, record: bytes) -> bool:
    """The line at [start, end) of events.jsonl is the one `record` (raw bytes) describes."""
    if not 0 <= start < end:
        return False
    with door.open_file(events) as f:
        f.seek(start)
        line = f.read(end - start)
    return line.endswith(b"\n") and encode(parse_event(line), end) == record
