"""The contract between engine and viewer: run-directory layout, event schema, JSONL I/O.

Stdlib only (the `tui` side imports it and must never load torch). Documented in docs/events.md.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any

SCHEMA_VERSION = 1
# what json.loads raises on a file that is not JSON: RecursionError for deep nesting ([[[[...)
JSON_ERRORS = (ValueError, RecursionError)
T_MIN, T_MAX = 946_684_800.0, 4_102_444_800.0   # 2000-01-01 .. 2100-01-01 UTC: a line's `t` outside is not a time

# kind -> fields every event of that kind carries (besides v, t, kind)
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "run_start": (
        "run_id", "attempt", "world_size", "nnodes", "device", "backend", "precision", "config",
        "params_total", "params_trainable", "tokens_per_step", "effective_batch",
        "static_mem_bytes", "start_step", "max_steps", "resumed_from", "torch_version",
        "git_commit",
    ),
    "step": (
        "step", "epoch", "loss", "lr", "grad_norm", "clipped", "tokens_per_s", "step_time_s",
        "data_wait_s", "samples_seen", "tokens_seen", "skipped", "mem_alloc_bytes",
        "mem_peak_bytes",
    ),
    "eval": ("step", "val_loss"),
    "metrics": ("step", "values"),  # a script's run.log(): {name: number}
    "checkpoint": ("step", "path", "bytes", "seconds", "reason", "request_id"),
    "incident": ("step", "code", "severity", "title", "detail", "advice", "evidence"),
    "control": ("request_id", "action", "status", "detail"),
    "run_end": ("step", "status", "reason"),
}

SEVERITIES = ("info", "warn", "error")
INCIDENT_CODES = (
    "dataloader_stall", "nan_loss", "loss_spike", "grad_explosion", "fp16_overflow",
    "clipping_active",  # info: gradients clipped on most steps (the effective lr is lower)
    "throughput_drop", "hang", "straggler", "memory_pressure", "oom", "nccl_timeout", "crash",
    "checkpoint_skipped",  # a damaged checkpoint passed over on resume
    "disk_full",  # a checkpoint that did not fit was skipped (or ended the run)
    "checkpoint_failed",  # a background (checkpoint.async) write failed: removed, never renamed into place
    "recompile",  # torch.compile compiled a graph again mid-run (a guard failed: shape, grad mode, ...)
)
EXIT_CODES = ("crash", "oom", "nccl_timeout")  # incidents that say how a rank ended
FAILURE_CODES = (*EXIT_CODES, "hang")  # incidents that name the rank that failed first
CONTROL_ACTIONS = ("checkpoint", "stop")


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


# ---- the rules of a line's values: the parser's (mt/records.py) and the writers' checks (mt/values.py)
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
