"""A script's step events, batched: `run.step` notes a tuple, a flush writes them all at once.

Every microsecond of a step is the script's, so a flushed step's line and index record are made
straight from its values, not through `make_event`, `dumps` and the index's parser: the bytes
are the same as that generic path's (tests/library/test_library.py holds them to it).
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable, Mapping

from mt.contract.events import SCHEMA, SCHEMA_VERSION, T_MAX, T_MIN, dumps

# what a script knows of a step, in the order drain fills them; every other required field is
# engine-only and always null (docs/events.md, "step")
_SCRIPT = {"step": "%d", "epoch": "%s", "loss": "%s", "lr": "%s", "grad_norm": "%s", "tokens_per_s": "%s", "step_time_s": "%s",
           "tokens_seen": "%s", "skipped": "false"}
# the line of a script's step, from the schema's required step fields in their order (made once)
_LINE = ('{"v":%d,"t":%%s,"kind":"step",' % SCHEMA_VERSION
         + ",".join(f'"{f.name}":{_SCRIPT.get(f.name, "null")}' for f in SCHEMA["step"] if f.required) + '%s}\n')
assert [f.name for f in SCHEMA["step"] if f.name in _SCRIPT] == list(_SCRIPT), "drain fills the line in this order"
_INF = math.inf
_STEP_MAX, _WHOLE_MAX = 1 << 53, 1 << 63


def _json(x: float | None) -> str:
    """A number as `dumps` writes it (non-finite ones as the strings "nan", "inf", "-inf")."""
    if x is None:
        return "null"
    if -_INF < x < _INF:
        return repr(x)
    return '"nan"' if x != x else '"inf"' if x > 0 else '"-inf"'


def _nonneg(x: float | None) -> bool:
    return x is None or not x < 0  # NaN included: the index keeps it, as the parser does


# (step, t, dt, loss, lr, grad_norm, tokens, extra, n, epoch): dt and tokens are those of the n steps this one
# closes (run.record's, between two of the framework's logs; run.step's: 1); epoch as the script said it
Noted = tuple[int, float, "float | None", "float | None", "float | None", "float | None", "float | None",
              "Mapping[str, float] | None", int, "float | None"]


class StepBatch:
    """Steps noted on rank 0 and not written yet; `drain` turns them into lines, index rows and
    the fields the rank-0 rules read."""

    def __init__(self) -> None:
        self._noted: deque[Noted] = deque()  # appends and pops are thread-safe (the heartbeat thread flushes too)
        # note((step, t, dt, loss, lr, grad_norm, tokens, extra, n, epoch)): the deque's own append, one C call
        self.note: Callable[[Noted], None] = self._noted.append
        self.tokens_seen = 0.0

    def __bool__(self) -> bool:
        return bool(self._noted)

    def drain(self) -> tuple[list[bytes], list[tuple[float, ...] | None], list[dict[str, Any]]]:
        """(lines, index rows, rule fields) of every step noted so far, oldest first."""
        from mt.contract.eventindex import record_float  # here: `import mt` stays light (the writer loads it anyway)
        lines: list[bytes] = []
        rows: list[tuple[float, ...] | None] = []
        fields: list[dict[str, Any]] = []
        while self._noted:
            step, t, dt, loss, lr, grad_norm, tokens, extra, n, epoch = self._noted.popleft()
            seen = None
            if tokens is not None:
                self.tokens_seen += tokens
                seen = int(self.tokens_seen)
            tps = tokens / dt if tokens and dt else None
            if n != 1 and dt is not None:
                dt /= n  # the step's own time
            lines.append((_LINE % (repr(t), step, _json(epoch), _json(loss), _json(lr), _json(grad_norm), _json(tps), _json(dt),
                                   "null" if seen is None else seen,
                                   ',"extra":' + dumps(dict(extra)) if extra else "")).encode())
            plain = (not extra and 0 <= step < _STEP_MAX and T_MIN <= t <= T_MAX and _nonneg(lr) and _nonneg(grad_norm)
                     and _nonneg(tps) and _nonneg(dt) and (seen is None or 0 <= seen < _WHOLE_MAX))
            rows.append((0, step, t, record_float(loss), record_float(lr), record_float(grad_norm), record_float(tps)) if plain else None)
            fields.append({"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm})
        return lines, rows, fields
