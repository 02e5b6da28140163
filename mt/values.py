"""A script's values as the event parser (mt/contract/records.py) takes them, checked at the library's call.

Wrong values are the script's own error: TypeError or ValueError naming the value, raised before
anything is recorded. docs/library.md.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

from mt.contract.events import SCHEMA, number, whole

_NONNEG = frozenset(f.name for f in SCHEMA["step"] if f.rule == "number" and f.nonneg)  # lr, grad_norm, ...


def as_number(value: Any, what: str, nonneg: bool = False, finite: bool = False) -> float | None:
    """A metric as a float (a 0-d tensor too) that the parser takes; None stays None.

    Text is not a number, though float() would read it: docs/library.md says numbers only."""
    if value is None:
        return None
    if isinstance(value, (bool, str, bytes, bytearray)):
        raise TypeError(f"mt: {what} must be a number, got {type(value).__name__} {value!r:.40}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"mt: {what} must be a number, got {type(value).__name__}") from None
    try:
        x = number(x, what, nonneg)
    except ValueError as e:
        raise ValueError(f"mt: {e}") from None
    if finite and not math.isfinite(x):  # summed into tokens_seen, a whole number
        raise ValueError(f"mt: {what} {x} is not finite")
    return x


def step_number(value: Any, name: str) -> float | None:
    """A step's number field (loss, lr, grad_norm) as the schema's rule for it takes it."""
    return as_number(value, name, nonneg=name in _NONNEG)


def as_whole(value: Any, what: str) -> int:
    """A step as the whole number the parser takes (0 <= step < 2**63), else TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) and not (hasattr(value, "__index__")):
        raise TypeError(f"mt: {what} must be a whole number, got {type(value).__name__}")
    try:
        return whole(int(value), what)
    except ValueError as e:
        raise ValueError(f"mt: {e}") from None


def plain(config: Mapping[str, Any]) -> Any:
    """The script's config as JSON can hold it (paths and other objects as their text)."""
    try:
        return json.loads(json.dumps(config, default=str))
    except (ValueError, TypeError) as e:  # a circular reference, keys that are not strings
        return {"unreadable": f"{type(e).__name__}: {e}"}
