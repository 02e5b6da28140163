"""The knobs a user may turn while a run goes on (`mt set`, the dashboard, `mt rollback`): their names,
types and bounds, the one parser of `KEY=VALUE`, and the state a checkpoint keeps. Stdlib only.

A knob overrides its preset value from the step it is applied at; the checkpoints written after it
keep it (train.pt's `knobs`), so a resume never undoes it (a resumed scheduler would)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


class KnobError(ValueError):
    """A setting that cannot be applied; str() is the one line to show the user."""


@dataclass(frozen=True)
class Spec:
    kind: type  # float or int
    low: float  # the smallest value allowed
    low_open: bool  # the low bound itself is refused (lr_scale > 0)
    help: str


SPECS: dict[str, Spec] = {
    "lr_scale": Spec(float, 0.0, True, "multiplies the scheduled learning rate from now on"),
    "grad_clip": Spec(float, 0.0, False, "the gradient-norm clip (0 disables it); train.grad_clip until set"),
    "eval_every": Spec(int, 0, False, "evaluate every N steps (0: never); train.eval_every until set"),
    "checkpoint_every": Spec(int, 0, False, "checkpoint every N steps (0: only on request and at the end)"),
    "log_every": Spec(int, 1, False, "a step event every N steps; train.log_every until set"),
    "skip_batches": Spec(int, 1, False, "skip the next N batches of the data order (once; the order is kept)"),
}
ONCE = frozenset({"skip_batches"})  # acted on once, not a lasting value


def parse_setting(text: str) -> tuple[str, float | int]:
    """`KEY=VALUE` checked against SPECS; KnobError names what is wrong."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise KnobError(f"{text!r}: expected KEY=VALUE (keys: {', '.join(SPECS)})")
    return key, check(key, raw)


def parse_settings(texts: list[str]) -> dict[str, float | int]:
    """Several `KEY=VALUE`, each checked, no key twice; KnobError names the first that is wrong."""
    settings: dict[str, float | int] = {}
    for text in texts:
        key, value = parse_setting(text)
        if key in settings:
            raise KnobError(f"{key}: given twice")
        settings[key] = value
    if not settings:
        raise KnobError(f"no setting: expected KEY=VALUE (keys: {', '.join(SPECS)})")
    return settings


def check(key: str, raw: Any) -> float | int:
    """The value of `key` from a string or number, within its bounds; KnobError names what is wrong."""
    spec = SPECS.get(key)
    if spec is None:
        raise KnobError(f"{key}: not a knob (knobs: {', '.join(SPECS)})")
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = spec.kind(float(raw)) if spec.kind is float else _as_int(raw)
    except (TypeError, ValueError):
        raise KnobError(f"{key}: {raw!r} is not {'a number' if spec.kind is float else 'a whole number'}") from None
    if spec.kind is float and not math.isfinite(value):
        raise KnobError(f"{key}: {raw!r} is not finite")
    if value < spec.low or (spec.low_open and value == spec.low):
        raise KnobError(f"{key}: {raw!r} must be {'>' if spec.low_open else '>='} {spec.low:g}")
    return value


def _as_int(raw: Any) -> int:
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, int):
        return raw
    return int(str(raw).strip())


@dataclass
class Knobs:
    """The lasting knobs of a run; None: the preset's value holds."""

    lr_scale: float = 1.0
    grad_clip: float | None = None
    eval_every: int | None = None
    checkpoint_every: int | None = None
    log_every: int | None = None

    def set(self, key: str, value: float | int) -> None:
        """One lasting knob, checked (skip_batches is not one: the loop acts on it once)."""
        if key in ONCE or key not in SPECS:
            raise KnobError(f"{key}: not a lasting knob")
        setattr(self, key, check(key, value))

    def to_state(self) -> dict[str, Any]:
        """What a checkpoint keeps: only the knobs that were turned."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and not (k == "lr_scale" and v == 1.0)}

    @classmethod
    def from_state(cls, state: Any) -> Knobs:
        """A checkpoint's knobs; a value that does not check is left at the preset's (an old or odd file)."""
        knobs = cls()
        if isinstance(state, dict):
            for key, value in state.items():
                try:
                    knobs.set(str(key), value)
                except KnobError:
                    pass
        return knobs
