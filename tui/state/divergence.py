"""Where two runs part: the first step at which their logged values differ bit for bit.

Pure: two runs' reduced plot histories (`RunSeries`, the one reducer: a resumed attempt or a
rollback has already replaced the steps it abandoned, so each step holds the value the run kept)
in, a `Divergence` out. Only values both runs logged at the same step are compared.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tui.state.runseries import RunSeries
    from tui.state.series import Series

COMPARED = ("loss", "grad_norm", "lr", "val_loss")   # mt's own values; tokens/s is timing, never equal


@dataclass(frozen=True)
class Gap:
    """One value the two runs logged differently at a step."""

    name: str
    a: float
    b: float

    @property
    def abs_diff(self) -> float:
        return abs(self.a - self.b)

    @property
    def rel_diff(self) -> float:
        """|A - B| over the larger magnitude (0 for two zeros; NaN where a side is not finite)."""
        scale = max(abs(self.a), abs(self.b))
        return 0.0 if self.abs_diff == 0 else self.abs_diff / scale if math.isfinite(scale) else math.nan


@dataclass(frozen=True)
class Divergence:
    """The first step whose values differ (None: they never do), and what was compared."""

    step: int | None
    last_equal: int | None               # the newest compared step before it (all equal there)
    gaps: list[Gap] = field(default_factory=list)
    names: list[str] = field(default_factory=list)   # the values both runs logged at a common step
    compared: int = 0                    # steps where both logged at least one of them
    last_common: int | None = None       # the newest of those steps
    last_a: int | None = None            # each run's newest logged step
    last_b: int | None = None


def _points(s: Series) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values), one value per step: the newest where a step repeats."""
    x, y = s.arrays()
    if len(x) and not np.all(np.diff(x) > 0):
        keep = len(x) - 1 - np.unique(x[::-1], return_index=True)[1]
        x, y = x[keep], y[keep]
    return x, y


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: identical float64 bits, or both NaN (an unknown value is NaN in a Series)."""
    return (a.view(np.int64) == b.view(np.int64)) | (np.isnan(a) & np.isnan(b))


def first_divergence(a: RunSeries, b: RunSeries) -> Divergence:
    """The first step at which any value both runs logged (COMPARED, then a script's metrics both
    log) differs, with every value that differs there."""
    names = [*COMPARED, *sorted(a.extra.keys() & b.extra.keys())]
    series = {n: (a.all()[n], b.all()[n]) if n in COMPARED else (a.extra[n], b.extra[n]) for n in names}
    common: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for name, (sa, sb) in series.items():
        (xa, ya), (xb, yb) = _points(sa), _points(sb)
        steps, ia, ib = np.intersect1d(xa, xb, assume_unique=True, return_indices=True)
        if len(steps):
            common[name] = (steps, ya[ia], yb[ib])
    all_steps = np.unique(np.concatenate([c[0] for c in common.values()])) if common else np.empty(0)
    first = math.inf
    for steps, va, vb in common.values():
        bad = np.flatnonzero(~same_bits(va, vb))
        if len(bad):
            first = min(first, steps[bad[0]])
    gaps = []
    if first != math.inf:
        for name, (steps, va, vb) in common.items():
            i = np.searchsorted(steps, first)
            if i < len(steps) and steps[i] == first and not same_bits(va[i:i + 1], vb[i:i + 1])[0]:
                gaps.append(Gap(name, float(va[i]), float(vb[i])))
    before = all_steps[all_steps < first]
    return Divergence(
        step=None if first == math.inf else int(first), last_equal=int(before[-1]) if len(before) else None,
        gaps=gaps, names=list(common), compared=len(all_steps),
        last_common=int(all_steps[-1]) if len(all_steps) else None, last_a=_last(a), last_b=_last(b))


def _last(s: RunSeries) -> int | None:
    steps = [float(x[-1]) for x, _ in (_points(v) for v in (*s.all().values(), *s.extra.values())) if len(x)]
    return int(max(steps)) if steps else None
