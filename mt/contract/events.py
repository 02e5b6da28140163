"""The contract between engine and viewer: run-directory layout, event schema, JSONL I/O.

Stdlib only (the `tui` side imports it and must never load torch). Documented in docs/events.md.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1
# what json.loads raises on a file that is not JSON: RecursionError for deep nesting ([[[[...)
JSON_ERRORS = (ValueError, RecursionError)
T_MIN, T_MAX = 946_684_800.0, 4_102_444_800.0   # 2000-01-01 .. 2100-01-01 UTC: a line's `t` outside is not a time

SEVERITIES = ("info", "warn", "error")
INCIDENT_CODES = (
    "dataloader_stall", "nan_loss", "loss_spike", "grad_explosion", "fp16_overflow",
    "clipping_active",  # info: gradients clipped on most steps (the effective lr is lower)
    "throughput_drop", "hang", "straggler", "memory_pressure", "oom", "nccl_timeout", "crash",
    "checkpoint_skipped",  # a damaged checkpoint passed over on resume
    "disk_full",  # a checkpoint that did not fit was skipped (or ended the run)
    "checkpoint_failed",  # a background (checkpoint.async) write failed: removed, never renamed into place
    "recompile",  # torch.compile compiled a graph again mid-run (a guard failed: shape, grad mode, ...)
    "stop_cut_short",  # Slurm ended an attempt before its stop's checkpoint landed: steps lost
    "eval_failed",  # [eval] factory raised or returned no {name: number}, or a sample could not be generated: the run goes on
    "rolled_back",  # a rollback was made (mt rollback, on_nan/on_spike = "rollback"): what, from where, by whom
)
EXIT_CODES = ("crash", "oom", "nccl_timeout")  # incidents that say how a rank ended
FAILURE_CODES = (*EXIT_CODES, "hang")  # incidents that name the rank that failed first
CONTROL_ACTIONS = ("checkpoint", "stop", "set")  # set: knobs (mt/contract/knobs.py), its `settings` in the request
SAMPLE_TEXT_MAX = 4000  # characters of a sample's text an event keeps (a line stays far below MAX_LINE_BYTES)


@dataclass(frozen=True, slots=True)
class Field:
    """One field of an event kind: the JSON type writers write, the parser's rule, who must write it."""

    name: str
    type: str               # what writers write: int, float, str, bool, object, list (null: unknown)
    rule: str               # the parser's (mt/contract/records.py): one of RULES
    required: bool = True   # every writer writes it (null where unknown); make_event checks
    key: bool = False       # a line without it (or with null) is rejected; else missing is unknown
    lo: int = 0             # whole: the least value
    nonneg: bool = False    # number: below zero is rejected
    choices: tuple[str, ...] = ()  # choice: the values allowed
    soft: bool = False      # a value breaking the rule is dropped (unknown), not the line


# whole: a whole number in lo..2**63 (an integral float too); number: a number or "nan"/"inf"/"-inf";
# time: a number within T_MIN..T_MAX; text: a string; choice: one of `choices`; values: {name: number};
# strings: a list of strings; object: a JSON object; flag: only true is true; free: not checked
RULES = ("whole", "number", "time", "text", "choice", "values", "strings", "object", "flag", "free")


def _whole(name: str, required: bool = True, key: bool = False, lo: int = 0) -> Field:
    return Field(name, "int", "whole", required or key, key, lo)


def _num(name: str, required: bool = True, nonneg: bool = False, soft: bool = False) -> Field:
    return Field(name, "float", "number", required, nonneg=nonneg, soft=soft)


def _text(name: str, required: bool = True, key: bool = False) -> Field:
    return Field(name, "str", "text", required or key, key)


def _free(name: str, type_: str, required: bool = True) -> Field:
    return Field(name, type_, "free", required)


# The event schema (docs/events.md): per kind, every field mt writes or reads, in the order
# writers write them (besides v, t, kind); required ones first, then the extras
SCHEMA: dict[str, tuple[Field, ...]] = {
    "run_start": (
        _free("run_id", "str"), _whole("attempt", lo=1), _whole("world_size", lo=1), _whole("nnodes", lo=1),
        _text("device"), _text("backend"), _text("precision"), _free("config", "object"), _whole("params_total"),
        Field("params_trainable", "int", "whole", soft=True), _whole("tokens_per_step"), _whole("effective_batch"),
        _free("static_mem_bytes", "int"), _whole("start_step"), _whole("max_steps"), _free("resumed_from", "object"),
        _free("torch_version", "str"), _free("git_commit", "str"),
        _free("grad_accum_steps", "int", False), _free("micro_batch_size", "int", False), _free("seq_len", "int", False),
        _free("flops_per_token", "float", False), _whole("params_active", False), _free("model", "str", False),
        Field("strategy", "str", "choice", False, choices=("ddp", "fsdp"), soft=True),
        Field("activation_checkpointing", "bool", "flag", False, soft=True),
        Field("compile", "bool", "flag", False, soft=True), _free("peak_flops", "float", False),
        _num("data_loss_floor", False, nonneg=True, soft=True),  # a finite number >= 0, else dropped
        _free("pid", "int", False), _free("source", "str", False), _free("script", "str", False),
        _num("grad_clip", False, nonneg=True, soft=True),  # a script's clip norm (mt.init grad_clip): the grad-norm plot's line
        Field("knobs", "list", "strings", False),  # the knobs `mt set` may turn in this attempt (mt's engine: all)
    ),
    "step": (
        _whole("step", key=True), _num("epoch", nonneg=True, soft=True), _num("loss"), _num("lr", nonneg=True), _num("grad_norm", nonneg=True),
        _free("clipped", "bool"), _num("tokens_per_s", nonneg=True), _num("step_time_s", nonneg=True),
        _num("data_wait_s", nonneg=True), _whole("samples_seen"), _whole("tokens_seen"), _free("skipped", "bool"),
        _whole("mem_alloc_bytes"), _whole("mem_peak_bytes"),
        _num("samples_per_s", False, nonneg=True), _free("loss_scale", "float", False), _whole("recompiles", False), _whole("host_syncs", False),
        _num("mfu", False, nonneg=True), _num("flops_per_token", False, nonneg=True),
        _free("flops_estimated", "bool", False),  # free: the index's fast path reads a step; only true is true
        Field("extra", "object", "values", False),  # a script's run.step(**metrics)
    ),
    "eval": (_whole("step", key=True), _num("val_loss"),
             Field("metrics", "object", "values", False)),  # [eval] factory's {name: number}
    "sample": (_whole("step", key=True), _whole("index"), _text("prompt"), _text("text"), _whole("tokens")),  # [eval] prompts
    "metrics": (_whole("step", key=True), Field("values", "object", "values")),  # a script's run.log()
    "checkpoint": (
        _whole("step", key=True), _text("path"), _whole("bytes"), _num("seconds", nonneg=True), _text("reason"),
        _text("request_id"), Field("request_ids", "list", "strings", False), _num("blocking_s", False, nonneg=True),
        Field("best", "object", "values", False), _text("best_metric", False),  # the best kept ([checkpoint] keep_best)
        Field("metrics", "object", "values", False),  # a script's numbers at that checkpoint (run.checkpoint_saved)
    ),
    "incident": (
        _whole("step"), _text("code", key=True), Field("severity", "str", "choice", choices=SEVERITIES),
        _text("title"), _text("detail"), _text("advice"), Field("evidence", "object", "object"),
        # incidents.jsonl's own (the supervisor's records; mt/contract/records.py parse_incident)
        Field("status", "str", "choice", False, choices=("open", "update", "closed")), _text("source", False),
        Field("event_t", "float", "time", False),
    ),
    "control": (_text("request_id", key=True), _text("action"), _text("status", key=True), _text("detail")),
    "run_end": (_whole("step"), _text("status", key=True), _text("reason")),
    # a knob turned (mt set, a rollback): `step` the first step it applies to; `request` the request's id or null
    "knob": (_whole("step", key=True), _text("key", key=True), _num("value"), _num("previous"),
             _text("by"), _text("request")),
    "rollback": (  # docs/events.md#rollback: the run went back to to_step's checkpoint
        _whole("step"), _whole("to_step", key=True), _whole("skip_batches"), _num("lr_scale", nonneg=True), _text("why"),
        Field("by", "str", "choice", choices=("user", "on_nan", "on_spike")), _whole("count", lo=1),
    ),
}
assert all(f.rule in RULES for fields in SCHEMA.values() for f in fields)

# kind -> fields every event of that kind carries (besides v, t, kind): what make_event checks
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    kind: tuple(f.name for f in fields if f.required) for kind, fields in SCHEMA.items()
}


def make_event(kind: str, **fields: Any) -> dict[str, Any]:
    """An event dict with the envelope filled in; raises on a missing field (a bug, not input)."""
    missing = [f for f in EVENT_FIELDS[kind] if f not in fields]
    if missing:
        raise ValueError(f"{kind} event lacks {missing}")
    return {"v": SCHEMA_VERSION, "t": time.time(), "kind": kind, **fields}


def schema_errors(event: Any) -> list[str]:
    """What is wrong with one parsed event line (empty when it matches the schema)."""
    if not isinstance(event, dict):
        return ["not a JSON object"]
    errors = []
    if event.get("v") != SCHEMA_VERSION:
        errors.append(f"v is {event.get('v')!r}")
    if not isinstance(event.get("t"), (int, float)):
        errors.append("t is not a number")
    kind = event.get("kind")
    if kind not in EVENT_FIELDS:
        errors.append(f"unknown kind {kind!r}")
        return errors
    errors += [f"{kind} lacks {f}" for f in EVENT_FIELDS[kind] if f not in event]
    return errors


def dumps(obj: Any) -> str:
    """One JSONL line. Non-finite floats become the strings "nan"/"inf" so every reader copes."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:  # rare: a NaN or inf somewhere
        return json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and math.isnan(obj):
        return "nan"
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def as_int(value: Any, default: int | None = None) -> int | None:
    """A whole number read from a run's file (`3`, `3.0`), else `default`: never a bool, a fraction or text."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, float) and math.isfinite(value) and value == int(value) else default


def as_float(value: Any) -> float:
    """A numeric event field as float, turning the "nan"/"inf" strings back into floats."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer beyond float range (a line from elsewhere)
            return float("inf") if value > 0 else float("-inf")
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return float("nan")
    return float("nan")


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One JSONL line as a dict; None when it is not a JSON object (torn, garbage, a list)."""
    try:
        obj = json.loads(line)
    except JSON_ERRORS:
        return None
    return obj if isinstance(obj, dict) else None


# ---- the rules of a line's values: the parser's (mt/contract/records.py) and the writers' checks (mt/values.py)
INT_MAX = 1 << 63
SPECIAL_FLOATS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}   # as events.dumps writes them


class BadValue(ValueError):
    """A value no line may hold; a ValueError, as the library's writer raises it at the call."""


class WrongType(BadValue, TypeError):
    """A value of the wrong type: a TypeError to the writer."""


def whole(v: Any, key: str, lo: int = 0) -> int:
    """`v` as the whole number a line may hold in `key`, else TypeError/ValueError saying why.

    The parser's rule, and the check mt's writers apply before they write (mt/run.py)."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise WrongType(f"{key} {show_value(v)} is not a whole number")
    if not lo <= v < INT_MAX:
        raise BadValue(f"{key} {show_value(v)} is out of range")
    return v


def number(v: Any, key: str, nonneg: bool = False) -> float:
    """`v` as the number a line may hold in `key`, else TypeError/ValueError saying why."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            x = float(v)
        except OverflowError:
            raise BadValue(f"{key} is out of range") from None
    elif isinstance(v, str) and v in SPECIAL_FLOATS:
        x = SPECIAL_FLOATS[v]
    else:
        raise WrongType(f"{key} {show_value(v)} is not a number")
    if nonneg and x < 0:
        raise BadValue(f"{key} {x:g} is negative")
    return x


def show_value(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
