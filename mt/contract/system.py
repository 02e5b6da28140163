"""The one reader of a `system.jsonl` line: a sample with every field of the right type, or None.

The supervisor writes these lines, but anything may be appended to the file; readers (the
dashboard, the incident rules) only ever see what `clean_sample` lets through.
"""
from __future__ import annotations

import math
from typing import Any

from mt.contract.events import T_MAX, T_MIN

_GPU = {"index": int, "mig": int, "uuid": str, "name": str, "ranks": list, "util_pct": float, "mem_used_bytes": int,
        "mem_total_bytes": int, "temp_c": float, "power_w": float}
_RANK = {"rank": int, "pid": int, "cpu_pct": float, "rss_bytes": int, "alive": bool}
# a rank on a GPU (its heartbeat said): the GPU's UUID (CUDA's form) and its caching allocator's bytes at its last step
_RANK_GPU = {"gpu": str, "mem_alloc_bytes": int, "mem_reserved_bytes": int, "mem_peak_bytes": int, "mem_total_bytes": int}
_WORKER = {"pid": int, "state": str, "syscall": str, "cmdline": str}
_HOST = {"cpu_pct": float, "mem_used_bytes": int, "mem_total_bytes": int, "load1": float}
_MAX_ENTRIES = 1024  # GPUs or ranks on one node: far more is not a sample


def _value(v: Any, kind: type) -> Any:
    """v if it is a value of `kind` (an int counts as a float; `list`: a list of ranks, whole numbers), else None."""
    if kind is list:
        return [r for r in v[:_MAX_ENTRIES] if _value(r, int) is not None] if isinstance(v, list) else None
    if kind is bool:
        return v if isinstance(v, bool) else None
    if isinstance(v, bool):
        return None
    if kind is int:
        return v if isinstance(v, int) and abs(v) < 2**63 else None
    if kind is float:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            f = float(v) if abs(v) < 1e300 else math.inf
            return f if math.isfinite(f) else None
        return None
    return v[:200] if isinstance(v, str) else None


def _entry(raw: Any, schema: dict[str, type], key: str) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    out = {k: _value(raw.get(k), kind) for k, kind in schema.items()}
    return out if out[key] is not None else None


def _entries(raw: Any, schema: dict[str, type], key: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        return []
    return [e for e in (_entry(r, schema, key) for r in raw[:_MAX_ENTRIES]) if e is not None]


def _ranks(raw: Any) -> list[dict[str, Any]]:
    """The rank entries; `syscall` and `workers` only where the entry has them (a job's other node), the
    GPU fields only where the rank reported its GPU."""
    out = _entries(raw, _RANK, "rank")
    if not isinstance(raw, list):
        return out
    by_rank = {r.get("rank"): r for r in raw[:_MAX_ENTRIES] if isinstance(r, dict)}
    for e in out:
        src = by_rank.get(e["rank"]) or {}
        if "workers" in src:
            e["syscall"] = _value(src.get("syscall"), str)
            e["workers"] = _entries(src.get("workers"), _WORKER, "pid")
        if any(k in src for k in _RANK_GPU):
            e.update({k: _value(src.get(k), kind) for k, kind in _RANK_GPU.items()})
    return out


def clean_sample(raw: Any) -> dict[str, Any] | None:
    """A sample in the shape SystemSampler writes, wrong-typed fields as None; None if not a sample."""
    if not isinstance(raw, dict):
        return None
    t = _value(raw.get("t"), float)
    if t is None or not T_MIN <= t <= T_MAX:
        return None
    host = raw.get("host") if isinstance(raw.get("host"), dict) else {}
    return {
        "v": _value(raw.get("v"), int),
        "t": t,
        "nvml": raw.get("nvml") is True,
        "nvml_error": _value(raw.get("nvml_error"), str),
        "gpus": _entries(raw.get("gpus"), _GPU, "index"),
        "ranks": _ranks(raw.get("ranks")),
        "host": {k: _value(host.get(k), kind) for k, kind in _HOST.items()},
    }
