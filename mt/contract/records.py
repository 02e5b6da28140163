"""The one typed parser of event lines: each becomes a typed record or a counted rejection.

Every reader of events.jsonl and incidents.jsonl (viewer, rules, supervisor, control client,
index) goes through `parse_event` / `parse_incident`, so they agree on what a line means. A
missing field is unknown (None); a value that cannot be true (a step that is not a whole
number, a loss that is a list, a time in 1970) rejects the whole line. Each field is judged by its
rule in mt/contract/events.py SCHEMA, and each kind's record is built from that table by one parser
(`_from_schema`): a field added there is judged with no code here. docs/events.md.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Union

from mt.contract.events import JSON_ERRORS, SCHEMA, SCHEMA_VERSION, SEVERITIES, T_MAX, T_MIN, Field, number, whole
from mt.contract.events import BadValue as _Bad
from mt.contract.events import show_value as _show
from mt.contract.incident import IncidentLine
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


# The records of the kinds below are built from SCHEMA by `_from_schema`: each field is named as
# in the table, and a field not written (or dropped) takes its default, None unless declared.
@dataclass(slots=True, kw_only=True)
class RunStart(Event):
    attempt: int | None = None
    world_size: int | None = None
    nnodes: int | None = None
    device: str | None = None
    backend: str | None = None
    precision: str | None = None
    params_total: int | None = None
    params_trainable: int | None = None  # fewer than params_total: a frozen base (LoRA)
    params_active: int | None = None     # a mixture of experts: what one token uses
    tokens_per_step: int | None = None
    effective_batch: int | None = None
    start_step: int = 0
    max_steps: int | None = None
    data_loss_floor: float | None = None  # the synthetic source's entropy: the best loss possible
    strategy: str | None = None          # "ddp" or "fsdp" (older runs: None)
    activation_checkpointing: bool = False
    compile: bool = False                # the model ran torch.compile'd
    grad_clip: float | None = None       # a script's clip norm (the engine's is its config's train.grad_clip)
    knobs: tuple[str, ...] | None = None  # the knobs `mt set` may turn (mt's engine: all; a script: none)
    kind: ClassVar[str] = "run_start"


@dataclass(slots=True, kw_only=True)
class Step(Event):
    step: int
    epoch: float | None = None             # whole from the engine, fractional from a Trainer (1.25)
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    data_wait_s: float | None = None
    mfu: float | None = None
    samples_per_s: float | None = None
    extra: dict[str, float] = field(default_factory=dict)  # a script's own metrics passed to run.step
    recompiles: int | None = None        # torch.compile recompilations during this step (compiled runs only)
    flops_per_token: float | None = None  # the model FLOPs per token mfu uses
    flops_estimated: bool = False         # ... the 6 x params estimate, not torch's count or the GPT's formula
    kind: ClassVar[str] = "step"

    @property
    def is_row(self) -> bool:
        """A plain step, a row of the plotted columns; one with extras travels as an event
        (the index's and the scanner's fixed columns cannot hold them)."""
        return not self.extra


@dataclass(slots=True, kw_only=True)
class Eval(Event):
    step: int
    val_loss: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # [eval] factory's named numbers
    kind: ClassVar[str] = "eval"


@dataclass(slots=True, kw_only=True)
class Sample(Event):
    """One [eval] prompt's continuation at an eval: `text` is what the model wrote after `prompt`."""

    step: int
    index: int | None = None
    prompt: str = ""
    text: str = ""
    tokens: int | None = None
    kind: ClassVar[str] = "sample"


@dataclass(slots=True, kw_only=True)
class Metrics(Event):
    """A script's `run.log(values, step)`: any named numbers at a step."""

    step: int
    values: dict[str, float] = field(default_factory=dict)
    kind: ClassVar[str] = "metrics"


@dataclass(slots=True, kw_only=True)
class Checkpoint(Event):
    step: int
    path: str = ""
    bytes: int | None = None
    seconds: float | None = None
    reason: str = ""
    request_id: str | None = None
    # every request this checkpoint answers (two in one step: both); not written: request_id's
    request_ids: tuple[str, ...] = None  # type: ignore[assignment]
    blocking_s: float | None = None      # how long the loop waited (checkpoint.async: staging only)
    best: dict[str, float] | None = None  # the best checkpoints kept after it ({step: value}, best first)
    best_metric: str | None = None
    metrics: dict[str, float] | None = None  # a script's own numbers at it (run.checkpoint_saved(metrics=...))
    kind: ClassVar[str] = "checkpoint"

    def __post_init__(self) -> None:
        if self.request_ids is None:
            self.request_ids = (self.request_id,) if self.request_id else ()


@dataclass(slots=True, kw_only=True)
class ControlEvent(Event):
    """A `control` event: rank 0's answer to a control request (accepted, rejected, done)."""

    request_id: str
    action: str = ""
    status: str
    detail: str = ""
    kind: ClassVar[str] = "control"


@dataclass(slots=True, kw_only=True)
class RunEnd(Event):
    step: int | None = None
    status: str
    reason: str = ""
    kind: ClassVar[str] = "run_end"


@dataclass(slots=True, kw_only=True)
class Knob(Event):
    """A knob turned (`mt set`, a rollback): its value from `step` on."""

    step: int
    key: str
    value: float | None = None
    previous: float | None = None
    by: str | None = None
    request: str | None = None
    kind: ClassVar[str] = "knob"


@dataclass(slots=True, kw_only=True)
class RollbackEvent(Event):
    """A `rollback` event: the run went back to `to_step`'s checkpoint (docs/events.md#rollback)."""

    step: int | None = None
    to_step: int
    skip_batches: int | None = None
    lr_scale: float | None = None
    why: str = ""
    by: str = ""
    count: int | None = None
    kind: ClassVar[str] = "rollback"


@dataclass(slots=True)
class Unknown(Event):
    """A well-formed event of a kind this version does not know: skipped, not counted."""

    name: str


Record = Union[RunStart, Step, Eval, Sample, Metrics, Checkpoint, IncidentLine, ControlEvent, RunEnd, Knob, RollbackEvent, Unknown]


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


_INCIDENT_STATES = next(f.choices for f in SCHEMA["incident"] if f.name == "status")


def _incident(raw: dict[str, Any], t: float | None) -> IncidentLine:
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
    return IncidentLine(
        code, severity, _int(raw, "step"), _str(raw, "title") or code, _str(raw, "detail") or "",  # type: ignore[arg-type]
        _str(raw, "advice") or "", evidence or {}, t, status, _str(raw, "source"), _time(raw, "event_t"), raw)


def _judge(f: Field, v: Any) -> Any:
    """A present value by its field's rule (mt/contract/events.py RULES): what the record holds,
    or _Bad saying why no line may hold it."""
    rule = f.rule
    if rule == "whole":
        return whole(v, f.name, f.lo)
    if rule == "number":
        x = number(v, f.name, f.nonneg)
        if f.soft and not math.isfinite(x):
            raise _Bad(f"{f.name} {x:g} is not finite")   # a soft number's use needs a finite one
        return x
    if rule == "time":
        return _time({f.name: v}, f.name)
    if rule == "text" or rule == "choice":
        if not isinstance(v, str):
            raise _Bad(f"{f.name} {_show(v)} is not a string")
        if rule == "choice" and v not in f.choices:
            raise _Bad(f"{f.name} {_show(v)} is not one of {', '.join(f.choices)}")
        return v
    if rule == "values":
        return _values(v, f.name)
    if rule == "strings":
        if not (isinstance(v, list) and all(isinstance(i, str) for i in v)):
            raise _Bad(f"{f.name} {_show(v)} is not a list of strings")
        return tuple(v)
    if rule == "object":
        if not isinstance(v, dict):
            raise _Bad(f"{f.name} is not an object")
        return v
    if rule == "flag":
        return v is True
    return v   # free: not checked


def _values(table: Any, key: str) -> dict[str, float]:
    """A table of named numbers (null entries left out); anything else rejects the line."""
    if not isinstance(table, dict):
        raise _Bad(f"{key} {_show(table)} is not an object")
    return {str(name): number(v, name) for name, v in table.items() if v is not None}


def _from_schema(cls: type[Event], raw: dict[str, Any], t: float | None) -> Any:
    """A record of `cls.kind` built from SCHEMA: every field judged by its rule (a soft one's
    odd value dropped), the ones the record declares kept."""
    keep = _HELD[cls]
    kw = {}
    for f in SCHEMA[cls.kind]:
        v = raw.get(f.name)
        if v is None:
            if f.key:
                raise _Bad(f"{f.name} is missing")
            continue
        if f.rule == "free":   # not checked (most of them not held either): skip the judge's call
            if f.name in keep:
                kw[f.name] = v
            continue
        try:
            x = _judge(f, v)
        except _Bad:
            if f.soft:
                continue
            raise
        if f.name in keep:
            kw[f.name] = x
    return cls(t=t, raw=raw, **kw)


_BUILT = (RunStart, Step, Eval, Sample, Metrics, Checkpoint, ControlEvent, RunEnd, Knob, RollbackEvent)   # all but the incident
_HELD = {cls: frozenset(f.name for f in fields(cls)) - {"t", "raw"} for cls in _BUILT}
_PARSERS: dict[str, Callable[[dict[str, Any], float | None], Any]] = {
    **{cls.kind: (lambda raw, t, cls=cls: _from_schema(cls, raw, t)) for cls in _BUILT}, "incident": _incident,
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


def parse_incident(line: bytes | str | dict[str, Any]) -> IncidentLine | Rejected:
    """One incidents.jsonl line (the supervisor's records) as an IncidentLine, or why not."""
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
