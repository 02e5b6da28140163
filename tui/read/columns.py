"""The byte-level scanner of events.jsonl: step lines by a learned regex, the rest by JSON.

A `step` line is flat and written with the same key order every time, so one regex built
from the first such line captures the plotted columns of a whole chunk in one C call. The
regex accepts only values `mt.contract.records.parse_event` would accept (a strict subset: whole-number
steps, plausible times, no negative rates), and every line must be accounted for, else the
chunk is redone line by line by the parser itself (exact, slower).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mt.contract import door
from mt.contract.events import JSON_ERRORS, SCHEMA, Field
from mt.contract.jsonl import MAX_LINE_BYTES, next_newline
from mt.contract.records import Record, Rejected, Step, parse_event

COLS = ("step", "loss", "lr", "grad_norm", "tokens_per_s")
CHUNK = 4 << 20                  # bytes per read: bounds memory, and keeps each regex call
                                 # (which holds the GIL) short so the UI thread stays live
_NONSTEP = re.compile(rb'"kind":"(?!step")')
_STEP = b'"kind":"step"'
# Values the regex takes for granted (valid JSON the parser accepts); anything else makes the
# chunk go through the parser. Bounded lengths keep a matched line far below MAX_LINE_BYTES.
_FLOAT = rb'(?:0|[1-9]\d{0,399})(?:\.\d{1,400})?(?:[eE][+-]?\d{1,4})?'
_NONNEG = rb'(?:' + _FLOAT + rb'|"nan"|"inf"|NaN|Infinity|null)'
_REAL = rb'(?:-?' + _FLOAT + rb'|"nan"|"inf"|"-inf"|NaN|-?Infinity|null)'
_VAL = rb'(?:"[^"\\\x00-\x1f]{0,4096}"|true|false|' + _REAL + rb')'
_WHOLE = rb'(?:0|[1-9]\d{0,17})'
_NONNEG_WHOLE = rb'(?:' + _WHOLE + rb'|null)'
_TIME = rb'(?:9[5-9]\d{7}|[1-3]\d{9}|40\d{8})(?:\.\d{1,20})?'   # 2000..2099, as records.T_MIN/T_MAX
_BY_RULE = {"whole": _NONNEG_WHOLE, "values": rb"null"}   # a table of values: the parser's, by the slow path


def _strict(f: Field) -> bytes:
    """What the regex takes for a step field, from its rule in mt/contract/events.py SCHEMA."""
    if f.soft:
        return _VAL   # an odd value is dropped by the parser, the line kept: any plain value
    if f.rule == "number":
        return _NONNEG if f.nonneg else _REAL
    if f.rule == "free":
        return _VAL
    assert f.rule in _BY_RULE and not f.lo and not f.key, f"the scanner cannot judge step's {f.name}"
    return _BY_RULE[f.rule]


_STRICT = {"v": rb"1", "t": _TIME, "step": _WHOLE, **{f.name: _strict(f) for f in SCHEMA["step"] if f.name != "step"}}


@dataclass
class Columns:
    """Step-event columns in file order, and the other events with their position among them."""

    rows: list[np.ndarray] = field(default_factory=list)          # blocks of shape (n, len(COLS))
    events: list[tuple[int, int, Record]] = field(default_factory=list)  # (offset, n_before, ev)
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
    """A regex for whole step lines with the key order of `line`, capturing COLS in key order."""
    try:
        ev = json.loads(line)
    except JSON_ERRORS:
        return None
    if not isinstance(ev, dict) or ev.get("kind") != "step" or "step" not in ev:
        return None
    parts = []
    for key, value in ev.items():
        if isinstance(value, (dict, list)):
            return None
        k = b'"' + re.escape(key.encode()) + b'":'
        if key == "kind":
            parts.append(k + b'"step"')
        elif key in COLS:
            parts.append(k + b"(?P<" + key.encode() + b">" + _STRICT[key] + b")")
        else:
            parts.append(k + _STRICT.get(key, _VAL))  # a key the schema does not know: any plain value
    return re.compile(rb"(?m)^\{" + b",".join(parts) + rb"\}$")


def _to_float(values: list[bytes]) -> np.ndarray:
    try:
        return np.fromiter(map(float, values), dtype=np.float64, count=len(values))
    except ValueError:  # null or a quoted "nan": the slow way (the regex let only these through)
        return np.array([np.nan if v == b"null" else float(v.strip(b'"')) for v in values])


class ColumnScanner:
    """Scans byte ranges of events.jsonl into `Columns`, with a JSON fallback for odd lines."""

    def __init__(self) -> None:
        self.pattern: re.Pattern[bytes] | None = None

    def scan(self, path: Path, start: int, end: int, out: Columns) -> int:
        """Scan complete lines of [start, end); returns the offset after the last complete line."""
        pos = start
        with door.open_file(path) as f:
            f.seek(start)
            carry = b""
            while pos + len(carry) < end:
                data = carry + f.read(min(CHUNK, end - pos - len(carry)))
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    if len(data) >= end - pos:
                        break           # a half-written last line: leave it for the follower
                    if len(data) > MAX_LINE_BYTES:
                        nl = next_newline(f, end)
                        if nl < 0:
                            break
                        out.bad_lines += 1      # an over-long line: skipped, never parsed
                        pos, carry = nl + 1, b""
                        f.seek(pos)
                        continue
                    carry = data
                    continue
                self._chunk(data, cut, pos, out)
                pos += cut
                carry = data[cut:]
        return pos

    def _chunk(self, data: bytes, cut: int, base: int, out: Columns) -> None:
        """One chunk of complete lines: step lines by regex, the rare other events by JSON.

        Every line must be accounted for (a step the regex matched, or an event); if not
        (garbage, a blank line, a writer that changed its key order) the chunk is redone
        line by line, which is slow but exact.
        """
        n_lines = data.count(b"\n", 0, cut)
        mark = (len(out.rows), out.n, len(out.events), out.bad_lines)
        other = 0
        seg_start = 0
        seen_lines: set[int] = set()
        for m in _NONSTEP.finditer(data, 0, cut):
            ls = data.rfind(b"\n", 0, m.start()) + 1
            if ls in seen_lines:
                continue        # a nested "kind" inside an event already taken (run_start config)
            seen_lines.add(ls)
            le = data.find(b"\n", m.start())
            self._steps(data, seg_start, ls, out)
            ev = parse_event(data[ls:le])
            if isinstance(ev, Rejected):
                out.bad_lines += 1
                other += 1
            elif not isinstance(ev, Step) or not ev.is_row:
                out.events.append((base + ls, out.n, ev))
                other += 1
            seg_start = le + 1
        self._steps(data, seg_start, cut, out)
        if out.n - mark[1] + other != n_lines:
            del out.rows[mark[0]:], out.events[mark[2]:]
            out.n, out.bad_lines = mark[1], mark[3]
            self._slow(data, 0, cut, base, out)

    def _steps(self, data: bytes, a: int, b: int, out: Columns) -> None:
        """Step lines of data[a:b] by regex (what it misses is caught by the line count)."""
        if b <= a:
            return
        if self.pattern is None:
            first = data.find(_STEP, a, b)
            if first < 0:
                return
            ls = data.rfind(b"\n", 0, first) + 1
            self.pattern = _step_pattern(data[ls:data.find(b"\n", first)])
            if self.pattern is None:
                return
        found = self.pattern.findall(data, a, b)
        if found:
            self._add(found, out)

    def _add(self, found: list[tuple[bytes, ...]], out: Columns) -> None:
        names = list(self.pattern.groupindex)          # group order = key order of the line
        block = np.full((len(found), len(COLS)), np.nan)
        for j, name in enumerate(names):
            block[:, COLS.index(name)] = _to_float([row[j] for row in found])
        out.add_rows(block)

    def _slow(self, data: bytes, a: int, b: int, base: int, out: Columns) -> None:
        rows = []
        pos = a
        for line in data[a:b].split(b"\n"):
            at, pos = pos, pos + len(line) + 1
            if not line.strip():
                continue
            ev = parse_event(line)
            if isinstance(ev, Rejected):
                out.bad_lines += 1
            elif isinstance(ev, Step) and ev.is_row:
                rows.append([ev.step, *(np.nan if v is None else v for v in (ev.loss, ev.lr, ev.grad_norm, ev.tokens_per_s))])
            else:
                if rows:
                    out.add_rows(np.array(rows))
                    rows = []
                out.events.append((base + at, out.n, ev))
        if rows:
            out.add_rows(np.array(rows))
        # learn the key order of the last step line seen (the writer may have changed it)
        last = data.rfind(_STEP, a, b)
        if last >= 0:
            ls = data.rfind(b"\n", 0, last) + 1
            le = data.find(b"\n", last)
            self.pattern = _step_pattern(data[ls:le if le >= 0 else b]) or self.pattern

