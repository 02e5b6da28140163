"""A release's requirements: `NAME OP NUMBER` (`val_loss < 2.0`), parsed once and judged against
the eval numbers at the released step. Stdlib only: the preset's `[release] require` is checked at
load, `mt release --require` by the CLI, and both are judged by `tui/report/release.py`."""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Callable

from mt.contract.events import number  # the one reader of a number a line holds

OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
}
_REQUIREMENT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.\-/]*)\s*(<=|>=|==|<|>)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Requirement:
    """One requirement: the eval number `name` compared by `op` with `number`."""

    name: str
    op: str
    number: float

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.number:g}"

    def unmet(self, numbers: dict[str, float]) -> str | None:
        """Why `numbers` (the eval at one step) do not meet it, or None when they do."""
        value = numbers.get(self.name)
        if value is None:
            return f"{self} not met: no {self.name} at that step"
        if not math.isfinite(value) or not OPS[self.op](value, self.number):
            return f"{self} not met: {self.name} = {value:.6g}"
        return None


def parse_requirement(text: str) -> Requirement:
    """`NAME OP NUMBER` with OP one of < <= > >= ==; ValueError saying what is wrong."""
    m = _REQUIREMENT.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"requirement {text!r}: expected NAME OP NUMBER with OP one of {' '.join(OPS)}, e.g. \"val_loss < 2.0\"")
    try:
        number = float(m.group(3))
    except ValueError:
        raise ValueError(f"requirement {text!r}: {m.group(3)!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"requirement {text!r}: {m.group(3)!r} is not a finite number")
    return Requirement(m.group(1), m.group(2), number)


def requirement_error(text: str) -> str | None:
    """What is wrong with a requirement's text (None: it parses): the preset's check."""
    try:
        parse_requirement(text)
    except ValueError as e:
        return str(e)
    return None


def eval_numbers(event: dict) -> dict[str, float]:
    """The numbers of an `eval` event by name: `val_loss` and each of its `metrics` ("nan" read as NaN;
    what is not a number left out)."""
    found: dict[str, float] = {}
    metrics = event.get("metrics")
    for name, value in [("val_loss", event.get("val_loss")), *(metrics.items() if isinstance(metrics, dict) else ())]:
        try:
            found[str(name)] = number(value, str(name))
        except (TypeError, ValueError):
            continue
    return found
