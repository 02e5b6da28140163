"""The one typed parser of event lines: each becomes a typed record or a counted rejection.

Every reader of events.jsonl and incidents.jsonl (viewer, rules, supervisor, control client,
index) goes through `parse_event` / `parse_incident`, so they agree on what a line means. A
missing field is unknown (None); a value that cannot be true (a step that is not a whole
number, a loss that is a list, a time in 1970) rejects the whole line. Each field is judged by its
rule in mt/contract/events.py SCHEMA (tests/tui/test_schema.py walks every kind and field). docs/events.md.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Union

from mt.contract.events import JSON_ERRORS, SCHEMA, SCHEMA_VERSION, SEVERITIES, T_MAX, T_MIN, number, whole
from mt.contract.events import BadValue as _Bad
from mt.contract.events import show_value as _show
from mt.contract.jsonl import MAX_LINE_BYTES, JsonlTail


@dataclass(frozen=True, slots=True)
class Rejected:
    """A line no reader may use, and why."""

    reason: str


@dataclass(slots=True)
class Event:
    """What every record has: when it was written, and the parsed line itself."""

    t: float | None
    raw: dict[str, Any] = field(repr=False)
    kind: ClassVar[str] = ""


@dataclass(slots=True)
class RunStart(Event):
    attempt: int | None
    world_size: int | None
    nnodes: int | None
    device: str | None
    backend: str | None
    precision: str | None
    params_total: int | None
    params_active: int | None          # a mixture of experts: what one token uses
    tokens_per_step: int | None
    effective_batch: int | None
    start_step: int
    max_steps: int | None
    data_loss_floor: float | None      # the synthetic source's entropy: the best loss possible
    strategy: str | None               # "ddp" or "fsdp" (older runs: None)
    activation_checkpointing: bool
    compile: bool                      # the model ran torch.compile'd
    grad_clip: float | None = None     # a script's clip norm (the engine's is its config's train.grad_clip)
    kind: ClassVar[str] = "run_start"


@dataclass(slots=True)
class Step(Event):
    step: int
    loss: float | None
    lr: float | None
    grad_norm: float | None
    tokens_per_s: float | None
    step_time_s: float | None
    data_wait_s: float | None
    mfu: float | None
    samples_per_s: float | None
    extra: dict[str, float]        # a script's own metrics passed to run.step (name -> value)
    recompiles: int | None         # torch.compile recompilations during this step (compiled runs only)
    kind: ClassVar[str] = "step"

    @property
    def is_row(self) -> bool:
        """A plain step, a row of the plotted columns; one with extras travels as an event
        (the index's and the scanner's fixed columns cannot hold them)."""
        return not self.extra


@dataclass(slots=True)
class Eval(Event):
    step: int
    val_loss: float | None
    kind: ClassVar[str] = "eval"


@dataclass(slots=True)
class Metrics(Event):
    """A script's `run.log(values, step)`: any named numbers at a step."""

    step: int
    values: dict[str, float]
    kind: ClassVar[str] = "metrics"


@dataclass(slots=True)
class Checkpoint(Event):
    step: int
    path: str
    bytes: int | None
    seconds: float | None
    reason: str
    request_id: str | None
    request_ids: tuple[str, ...]    # every request this checkpoint answers (two in one step: both)
    blocking_s: float | None = None  # how long the loop waited (checkpoint.async: staging only)
    kind: ClassVar[str] = "checkpoint"


@dataclass(slots=True)
class Incident(Event):
    """An `incident` event, or a line of incidents.jsonl (which adds status and source)."""

    code: str
    severity: str
    step: int | None
    title: str
    detail: str
    advice: str
    evidence: dict[str, Any]
    status: str            # "open" | "update" (more evidence for the open one) | "closed"
    source: str | None     # "engine" | "supervisor" (incidents.jsonl only)
    event_t: float | None  # when the engine raised a copied incident
    kind: ClassVar[str] = "incident"


@dataclass(slots=True)
class ControlEvent(Event):
    """A `control` event: rank 0's answer to a control request (accepted, rejected, done)."""

    request_id: str
    action: str
    status: str
    detail: str
    kind: ClassVar[str] = "control"


@dataclass(slots=True)
class RunEnd(Event):
    step: int | None
    status: str
    reason: str
    kind: ClassVar[str] = "run_end"


@dataclass(slots=True)
class Unknown(Event):
    """A well-formed event of a kind this version does not know: skipped, not counted."""

    name: str


Record = Union[RunStart, Step, Eval, Metrics, Checkpoint, Incident, ControlEvent, RunEnd, Unknown]


def _int(raw: dict[str, Any], key: str, lo: int = 0, required: bool = False) -> int | None:
    v = raw.get(key)
    if v is None:
        if required:
            raise _Bad(f"{key} is missing")
        return None
    return whole(v, key, lo)


def _num(raw: dict[str, Any], key: str, nonneg: bool = False) -> float | None:
    v = raw.get(key)
    return None if v is None else number(v, key, nonneg)


def _str(raw: dict[str, Any], key: str, required: bool = False) -> str | None:
    v = raw.get(key)
    if v is None:
        if required:
            raise _Bad(f"{key} is missing")
        return None
    if not isinstance(v, str):
        raise _Bad(f"{key} {_show(v)} is not a string")
    return v


def _time(raw: dict[str, Any], key: str = "t") -> float | None:
    t = _num(raw, key)
    if t is None or math.isnan(t):
        return None             # unknown (an index record of a line without one)
    if not T_MIN <= t <= T_MAX:
        raise _Bad(f"{key} {t:g} is not a time between 2000 and 2100")
    return t


def _choices(kind: str, name: str) -> tuple[str, ...]:
    return next(f.choices for f in SCHEMA[kind] if f.name == name)


_STRATEGIES, _INCIDENT_STATES = _choices("run_start", "strategy"), _choices("incident", "status")


def _run_start(raw: dict[str, Any], t: float | None) -> RunStart:
    return RunStart(
        t, raw, _int(raw, "attempt", 1), _int(raw, "world_size", 1), _int(raw, "nnodes", 1),
        _str(raw, "device"), _str(raw, "backend"), _str(raw, "precision"), _int(raw, "params_total"),
        _int(raw, "params_active"), _int(raw, "tokens_per_step"), _int(raw, "effective_batch"), _int(raw, "start_step") or 0,
        _int(raw, "max_steps"), _floor(raw), raw.get("strategy") if raw.get("strategy") in _STRATEGIES else None,
        raw.get("activation_checkpointing") is True,  # optional extras: an odd value is dropped, not the line
        raw.get("compile") is True, _floor(raw, "grad_clip"))


def _floor(raw: dict[str, Any], name: str = "data_loss_floor") -> float | None:
    """data_loss_floor or grad_clip, optional extras: one that cannot be true is dropped, not the run_start."""
    try:
        x = _num(raw, name, nonneg=True)
    except _Bad:
        return None
    return x if x is not None and math.isfinite(x) else None


# a step's counts that no record field holds, checked all the same (the table's other whole fields)
_STEP_COUNTS = tuple(f.name for f in SCHEMA["step"] if f.rule == "whole" and f.name not in Step.__dataclass_fields__)


def _step(raw: dict[str, Any], t: float | None) -> Step:
    for key in _STEP_COUNTS:
        _int(raw, key)
    return Step(
        t, raw, _int(raw, "step", required=True), _num(raw, "loss"), _num(raw, "lr", True),  # type: ignore[arg-type]
        _num(raw, "grad_norm", True), _num(raw, "tokens_per_s", True), _num(raw, "step_time_s", True),
        _num(raw, "data_wait_s", True), _num(raw, "mfu", True), _num(raw, "samples_per_s", True), _values(raw, "extra"),
        _int(raw, "recompiles"))


def _values(raw: dict[str, Any], key: str) -> dict[str, float]:
    """A table of named numbers ({} when absent); anything else rejects the line."""
    table = raw.get(key)
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise _Bad(f"{key} {_show(table)} is not an object")
    out = {}
    for name in table:
        v = _num(table, name)
        if v is not None:
            out[str(name)] = v
    return out


def _metrics(raw: dict[str, Any], t: float | None) -> Metrics:
    return Metrics(t, raw, _int(raw, "step", required=True), _values(raw, "values"))  # type: ignore[arg-type]


def _eval(raw: dict[str, Any], t: float | None) -> Eval:
    return Eval(t, raw, _int(raw, "step", required=True), _num(raw, "val_loss"))  # type: ignore[arg-type]


def _checkpoint(raw: dict[str, Any], t: float | None) -> Checkpoint:
    first = _str(raw, "request_id")
    ids = raw.get("request_ids")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise _Bad(f"request_ids {_show(ids)} is not a list of strings")
    return Checkpoint(
        t, raw, _int(raw, "step", required=True), _str(raw, "path") or "", _int(raw, "bytes"),  # type: ignore[arg-type]
        _num(raw, "seconds", True), _str(raw, "reason") or "", first,
        tuple(ids) if ids is not None else (first,) if first else (), _num(raw, "blocking_s", True))


def _incident(raw: dict[str, Any], t: float | None) -> Incident:
    severity = _str(raw, "severity") or "info"
    if severity not in SEVERITIES:
        raise _Bad(f"severity {_show(severity)} is not one of {', '.join(SEVERITIES)}")
    status = _str(raw, "status") or "open"
    if status not in _INCIDENT_STATES:
        raise _Bad(f"status {_show(status)} is not one of {', '.join(_INCIDENT_STATES)}")
    evidence = raw.get("evidence")
    if evidence is not None and not isinstance(evidence, dict):
        raise _Bad("evidence is not an object")
    code = _str(raw, "code", required=True)
    return Incident(
        t, raw, code, severity, _int(raw, "step"), _str(raw, "title") or code,  # type: ignore[arg-type]
        _str(raw, "detail") or "", _str(raw, "advice") or "", evidence or {}, status,
        _str(raw, "source"), _time(raw, "event_t"))


def _control(raw: dict[str, Any], t: float | None) -> ControlEvent:
    return ControlEvent(t, raw, _str(raw, "request_id", True), _str(raw, "action") or "",  # type: ignore[arg-type]
                   _str(raw, "status", True), _str(raw, "detail") or "")  # type: ignore[arg-type]


def _run_end(raw: dict[str, Any], t: float | None) -> RunEnd:
    return RunEnd(t, raw, _int(raw, "step"), _str(raw, "status", True), _str(raw, "reason") or "")  # type: ignore[arg-type]


_PARSERS: dict[str, Callable[[dict[str, Any], float | None], Any]] = {
    "run_start": _run_start, "step": _step, "eval": _eval, "metrics": _metrics, "checkpoint": _checkpoint,
    "incident": _incident, "control": _control, "run_end": _run_end,
}


def _load(line: bytes | str | dict[str, Any]) -> dict[str, Any] | Rejected:
    if isinstance(line, dict):
        return line
    if len(line) > MAX_LINE_BYTES:
        return Rejected(f"a line of {len(line)} bytes (over {MAX_LINE_BYTES})")
    try:
        raw = json.loads(line)
    except JSON_ERRORS:
        return Rejected("not JSON")
    return raw if isinstance(raw, dict) else Rejected("not a JSON object")


def parse_event(line: bytes | str | dict[str, Any]) -> Record | Rejected:
    """One events.jsonl line (or its parsed dict) as a typed record, or why it is rejected."""
    raw = _load(line)
    if isinstance(raw, Rejected):
        return raw
    kind = raw.get("kind")
    try:
        if not isinstance(kind, str):
            raise _Bad(f"kind {_show(kind)} is not a string")
        v = raw.get("v")
        if v is not None and v != SCHEMA_VERSION:
            raise _Bad(f"schema version {_show(v)} (this mt reads {SCHEMA_VERSION})")
        t = _time(raw)
        parse = _PARSERS.get(kind)
        return Unknown(t, raw, kind) if parse is None else parse(raw, t)
    except _Bad as e:
        return Rejected(f"{kind if isinstance(kind, str) else 'event'}: {e}")


def parse_incident(line: bytes | str | dict[str, Any]) -> Incident | Rejected:
    """One incidents.jsonl line (the supervisor's records) as an Incident, or why not."""
    raw = _load(line)
    if isinstance(raw, Rejected):
        return raw
    try:
        return _incident(raw, _time(raw))
    except _Bad as e:
        return Rejected(f"incident: {e}")


class RecordTail(JsonlTail):
    """A JsonlTail yielding typed records; rejected lines count in `bad_lines`."""

    def __init__(self, path: Path | str, offset: int = 0, ino: int | None = None,
                 parse: Callable[[bytes], Any] = parse_event) -> None:
        super().__init__(path, offset, ino)
        self._parse = parse

    def iter_new(self, max_bytes: int | None = None) -> Iterator[Any]:
        for line in self.iter_lines(max_bytes):
            rec = self._parse(line)
            if isinstance(rec, Rejected):
                self.reject(rec.reason)
            else:
                yield rec


def incident_tail(path: Path | str) -> RecordTail:
    """A tail of incidents.jsonl."""
    return RecordTail(path, parse=parse_incident)


def read_records(path: Path | str, parse: Callable[[bytes], Any] = parse_event) -> list[Any]:
    """Every valid record of a whole file (its last line counts when it is complete)."""
    return [r for r in (parse(line) for line in JsonlTail(path).iter_all_lines()) if not isinstance(r, Rejected)]
