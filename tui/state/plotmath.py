"""TensorBoard's debiased EMA and min/max downsampling of a `Series` for drawing. Pure numpy."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

import numpy as np

from tui.state.series import Series


def ema_debiased(values: np.ndarray | Iterable[float], weight: float) -> np.ndarray:
    """TensorBoard's smoothing: EMA debiased by 1 - w^n; non-finite points pass through untouched."""
    return EmaState(weight).extend(np.asarray(values, dtype=np.float64))


@dataclass
class EmaState:
    """Incremental debiased EMA, so a live plot smooths only the points that arrived since."""

    weight: float
    last: float = 0.0
    count: int = 0

    def extend(self, values: np.ndarray) -> np.ndarray:
        w = min(max(self.weight, 0.0), 1.0)
        out = np.array(values, dtype=np.float64, copy=True)
        finite = np.isfinite(out)
        z = out[finite]
        if not z.size:
            return out
        if w == 0.0:
            self.last, self.count = float(z[-1]), self.count + z.size
            return out
        acc = _ema_accumulate(z, w, self.last)
        counts = self.count + np.arange(1, z.size + 1, dtype=np.float64)
        out[finite] = acc if w == 1.0 else acc / (1.0 - w ** counts)
        self.last, self.count = float(acc[-1]), self.count + z.size
        return out


_BLOCK = 256


@lru_cache(maxsize=8)
def _kernel(w: float) -> tuple[np.ndarray, np.ndarray]:
    """The in-block EMA matrix kernel[i, j] = (1-w) w^(i-j) (i >= j), and w^(i+1) for the carry."""
    i = np.arange(_BLOCK)
    lag = i[:, None] - i[None, :]
    kernel = np.where(lag >= 0, (1.0 - w) * w ** np.maximum(lag, 0), 0.0)
    return kernel, w ** (i + 1.0)


def _ema_accumulate(z: np.ndarray, w: float, last: float) -> np.ndarray:
    """acc[k] = w * acc[k-1] + (1 - w) * z[k], acc[-1] = last, without a per-point Python loop.

    Blocks of 256 points go through one matrix product (the in-block recurrence unrolled:
    only decaying powers of w, so no precision loss); a short loop carries between blocks.
    """
    n = z.size
    nb = -(-n // _BLOCK)
    zb = np.zeros(nb * _BLOCK)
    zb[:n] = z
    zb = zb.reshape(nb, _BLOCK)
    kernel, decay = _kernel(w)
    inner = zb @ kernel.T               # each block as if it started from 0
    carry = np.empty(nb)
    c, w_block = last, w ** _BLOCK
    for b in range(nb):                 # n / 256 iterations
        carry[b] = c
        c = inner[b, -1] + w_block * c
    return (inner + carry[:, None] * decay[None, :]).reshape(-1)[:n]


@dataclass
class Downsampled:
    """Per-column extremes of a curve: draw min..max in every column and no spike is lost."""

    x: np.ndarray       # column centre (in x units), only non-empty columns
    ymin: np.ndarray    # min of the finite points of the column (nan when none is finite)
    ymax: np.ndarray
    bad_x: np.ndarray   # x of every column that holds a nan/inf point (marked on the plot)

    def zigzag(self) -> tuple[list[float], list[float]]:
        """(x, y) lists visiting min then max of each column, for a line plot."""
        ok = np.isfinite(self.ymin)
        xs = np.repeat(self.x[ok], 2)
        ys = np.empty(xs.size)
        ys[0::2], ys[1::2] = self.ymin[ok], self.ymax[ok]
        return xs.tolist(), ys.tolist()


def minmax_downsample(
    x: np.ndarray, y: np.ndarray, width: int, x_range: tuple[float, float] | None = None
) -> Downsampled:
    """Bucket points into `width` equal x-columns keeping each column's min and max (x ascending)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    empty = np.empty(0)
    if x.size == 0 or width <= 0:
        return Downsampled(empty, empty, empty, empty)
    lo, hi = x_range if x_range else (float(x[0]), float(x[-1]))
    if hi <= lo:
        hi = lo + 1.0
    span = (hi - lo) / width
    # Column boundaries as positions in x; x is sorted so each column is a contiguous slice.
    edges = lo + span * np.arange(1, width)
    starts = np.concatenate(([0], np.searchsorted(x, edges, side="left")))
    ends = np.concatenate((starts[1:], [x.size]))
    nonempty = ends > starts
    starts, ends = starts[nonempty], ends[nonempty]
    cols = np.flatnonzero(nonempty)
    finite = np.isfinite(y)
    ymin = np.minimum.reduceat(np.where(finite, y, np.inf), starts)
    ymax = np.maximum.reduceat(np.where(finite, y, -np.inf), starts)
    has_bad = np.add.reduceat((~finite).astype(np.int64), starts) > 0
    none_ok = ~np.isfinite(ymin)
    ymin[none_ok] = np.nan
    ymax[none_ok] = np.nan
    centres = lo + span * (cols + 0.5)
    return Downsampled(centres, ymin, ymax, centres[has_bad])


@dataclass
class SmoothCache:
    """The smoothed copy of one Series, extended incrementally while only appends happen."""

    weight: float = -1.0
    generation: int = -1
    smoothed: np.ndarray = field(default_factory=lambda: np.empty(0))
    ema: EmaState = field(default_factory=lambda: EmaState(0.0))

    def get(self, series: Series, weight: float) -> np.ndarray:
        """Smoothed y of `series` (copy, safe to keep while the series grows)."""
        _, y = series.arrays()
        n = len(self.smoothed)
        if weight != self.weight or series.generation != self.generation or y.size < n:
            self.weight, self.generation = weight, series.generation
            self.ema = EmaState(weight)
            self.smoothed = self.ema.extend(y)
        elif y.size > n:
            self.smoothed = np.concatenate((self.smoothed, self.ema.extend(y[n:])))
        return self.smoothed
