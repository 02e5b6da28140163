"""The fields of each event kind that both the engine and a script's library write, built in one place.

Each builder returns the keyword fields of `EventWriter.emit(kind, ...)` in the order they go on
disk (docs/events.md), so the engine's and the library's lines of a kind carry the same keys.
"""
from __future__ import annotations

from typing import Any

from mt.contract.events import SCHEMA

_RUN_START_FIELDS = frozenset(f.name for f in SCHEMA["run_start"])


def run_start(*, run_id: str, attempt: int, world_size: int, local_world_size: int, device: str | None,
              backend: str | None, precision: str | None, config: Any, params_total: int | None,
              params_trainable: int | None, tokens_per_step: int | None, effective_batch: int | None,
              static_mem_bytes: int | None, start_step: int, max_steps: int | None, resumed_from: Any,
              torch_version: str | None, git_commit: str | None, **extra: Any) -> dict[str, Any]:
    """A run_start's fields: the required ones (nnodes from the local world size), then `extra`,
    each a run_start field of the schema (an unknown name is a bug: ValueError)."""
    unknown = [name for name in extra if name not in _RUN_START_FIELDS]
    if unknown:
        raise ValueError(f"run_start has no field {unknown} (mt/contract/events.py SCHEMA)")
    return {
        "run_id": run_id, "attempt": attempt, "world_size": world_size,
        "nnodes": max(1, world_size // max(1, local_world_size)), "device": device, "backend": backend,
        "precision": precision, "config": config, "params_total": params_total, "params_trainable": params_trainable,
        "tokens_per_step": tokens_per_step, "effective_batch": effective_batch, "static_mem_bytes": static_mem_bytes,
        "start_step": start_step, "max_steps": max_steps, "resumed_from": resumed_from, "torch_version": torch_version,
        "git_commit": git_commit, **extra,
    }


def checkpoint(step: int, path: str, size: int | None, seconds: float | None, reason: str, request_ids: list[str],
               blocking_s: float | None = None) -> dict[str, Any]:
    """A checkpoint's fields: `request_id` the first request it answers, `blocking_s` only when known."""
    fields: dict[str, Any] = {"step": step, "path": path, "bytes": size, "seconds": seconds}
    if blocking_s is not None:
        fields["blocking_s"] = blocking_s
    fields.update(reason=reason, request_id=request_ids[0] if request_ids else None, request_ids=list(request_ids))
    return fields


def control_answer(request_id: str, action: str, status: str, detail: str) -> dict[str, Any]:
    """Rank 0's answer to a control request: `accepted`, `rejected` or `done` (docs/control.md)."""
    return {"request_id": request_id, "action": action, "status": status, "detail": detail}


def accepted(request_id: str, action: str, step: int) -> dict[str, Any]:
    """A request taken at the start of `step`, the step about to run."""
    return control_answer(request_id, action, "accepted", f"at step {step}")


def saved(request_id: str, action: str, step: int, path: object) -> dict[str, Any]:
    """A request answered by the checkpoint saved at `step` in `path`."""
    return control_answer(request_id, action, "done", f"checkpoint saved at step {step}: {path}")
