"""A run's plot history, x = optimizer step: mt's own series and a script's metrics by name."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mt.contract.records import Eval, Metrics, Record, RunStart, Step, Unknown

if TYPE_CHECKING:
    from tui.state.series import Series


def _series() -> "Series":
    # imported here: a Series loads numpy with its first point, which `mt ls` never pays for
    from tui.state.series import Series
    return Series()


@dataclass
class RunSeries:
    """Full plot history of a run, x = optimizer step."""

    loss: "Series" = field(default_factory=_series)
    val_loss: "Series" = field(default_factory=_series)
    lr: "Series" = field(default_factory=_series)
    grad_norm: "Series" = field(default_factory=_series)
    tokens_per_s: "Series" = field(default_factory=_series)
    extra: dict[str, "Series"] = field(default_factory=dict)
    """A script's own metrics (run.step's keyword arguments and run.log's values), by name."""
    rewinds: list[tuple[float | None, float]] = field(default_factory=list)
    """(when, step) of each rewind (a new attempt's start, a rollback): what followed `step` before then is gone."""
    _now: float | None = field(default=None, repr=False)   # the time of the event being folded
    marks: "Series" = field(default_factory=_series)
    """Vertical marks, x = step: MARK_ROLLBACK where a rollback went back to, MARK_KNOB where a knob applies."""

    def all(self) -> dict[str, "Series"]:
        return {"loss": self.loss, "val_loss": self.val_loss, "lr": self.lr, "grad_norm": self.grad_norm,
                "tokens_per_s": self.tokens_per_s, "marks": self.marks}

    def truncate_after(self, step: float) -> None:
        self.rewinds.append((self._now, step))
        for s in (*self.all().values(), *self.extra.values()):
            s.truncate_after(step)

    def replace(self, other: "RunSeries") -> None:
        for name, s in self.all().items():
            s.replace(other.all()[name])
        for name, s in other.extra.items():
            self.extra_series(name).replace(s)
        for name in self.extra.keys() - other.extra.keys():
            self.extra[name].clear()
        self.rewinds = list(other.rewinds)

    def extra_series(self, name: str) -> "Series":
        if name not in self.extra:
            self.extra[name] = _series()
        return self.extra[name]

    def add_step(self, ev: Step) -> None:
        self.loss.append(ev.step, _f(ev.loss))
        self.lr.append(ev.step, _f(ev.lr))
        self.grad_norm.append(ev.step, _f(ev.grad_norm))
        self.tokens_per_s.append(ev.step, _f(ev.tokens_per_s))
        for name, v in ev.extra.items():
            self.extra_series(name).append(ev.step, v)

    def add_event(self, ev: Record) -> None:
        """A non-step event: a new attempt drops what followed its checkpoint; an eval adds a point."""
        self._now = ev.t
        if isinstance(ev, RunStart):
            self.truncate_after(ev.start_step)   # a rollback's abandoned steps too: its run_start is at to_step
        elif (kind := ev.name if isinstance(ev, Unknown) else ev.kind) in MARK_KINDS:  # knob: Unknown until its record
            step = ev.raw.get("to_step" if kind == "rollback" else "step")
            if isinstance(step, int) and not isinstance(step, bool):
                self.marks.append(step, MARK_KINDS[kind])
        elif isinstance(ev, Eval):
            self.val_loss.append(ev.step, _f(ev.val_loss))
            for name, v in ev.metrics.items():  # [eval] factory's numbers, plotted like a script's own
                self.extra_series(f"eval/{name}").append(ev.step, v)
        elif isinstance(ev, Metrics):
            for name, v in ev.values.items():
                (self.val_loss if name == "val_loss" else self.extra_series(name)).append(ev.step, v)


MARK_ROLLBACK, MARK_KNOB = 0.0, 1.0
MARK_KINDS = {"rollback": MARK_ROLLBACK, "knob": MARK_KNOB}  # the knob event is the knobs' (docs/events.md)


def _f(v: float | None) -> float:
    """A value as a plot y: an unknown one is a gap, like a NaN."""
    return math.nan if v is None else v
