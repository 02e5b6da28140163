"""TensorBoard's debiased EMA, min/max downsampling of a `Series`, log-y points, axis ticks and the
points inside an x window (zoom). Pure."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

import numpy as np

from tui.format.fmt import fmt_compact
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


# ---------------------------------------------------------------- log-y and axis ticks


def log_points(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, log10 y) for a log axis: finite y <= 0 have no logarithm and are dropped; nan/inf stay
    (as nan/inf, so they are still marked as bad points)."""
    drop = np.isfinite(y) & (y <= 0)
    if drop.any():  # rare: no copy of a million points for nothing
        x, y = x[~drop], y[~drop]
    with np.errstate(invalid="ignore"):  # log10(-inf) is nan: still a bad point
        return x, np.log10(y)


def nice_step(span: float, n: int, integer: bool = False) -> float:
    """The round step (1, 2, 2.5 or 5 x 10^k; 1, 2 or 5 when `integer`) giving about n intervals
    (a few more rather than half as many: 0.5 for a span of 2.1 in 4)."""
    raw = span / max(n, 1)
    if integer and raw <= 1:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in ((1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)):
        if m * mag >= raw * 0.8:
            return m * mag
    return 10 * mag


def linear_ticks(lo: float, hi: float, n: int, integer: bool = False) -> list[float]:
    """Multiples of a round step inside [lo, hi], about n of them."""
    if not hi > lo:
        return [lo]
    step = nice_step(hi - lo, n, integer)
    k0, k1 = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    # through a decimal string: 3 * 0.1 is 0.30000000000000004, its label would be too
    ticks = (float(f"{k * step:.12g}") for k in range(k0, k1 + 1))
    return [t for t in ticks if math.isfinite(t)]   # the top one near the float range rounds past it


def log_ticks(lo: float, hi: float, n: int) -> list[float]:
    """Ticks of a log axis over [lo, hi] (real values, > 0), at most about n: powers of ten, or
    1-2-5 x 10^k, or every digit x 10^k, the densest that fits; round linear steps for a range
    narrower than one digit."""
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    eps = 1e-9 * (hi - lo)
    best: list[float] = []
    for digits in ((1,), (1, 2, 5), range(1, 10)):
        ticks = [float(f"{d}e{e}") for e in range(e0, e1 + 1) for d in digits]
        # past the float range 2e308 is inf and 1e-324 is 0: neither is a tick
        ticks = [t for t in ticks if lo - eps <= t <= hi + eps and 0 < t < math.inf]
        if len(ticks) > max(n, 2):
            # too dense: keep the sparser set, or thin this one if it is the first with two
            return best or ticks[:: math.ceil(len(ticks) / max(n, 2))]
        if len(ticks) >= 2:
            best = ticks
    return best or linear_ticks(lo, hi, n)


def tick_labels(values: list[float]) -> list[str]:
    """Compact labels (34.6k, 3e-4) with just enough digits to tell every tick apart."""
    for sig in range(3, 10):
        labels = [fmt_compact(v, sig) for v in values]
        if len(set(labels)) == len(labels):
            return labels
    return labels


@dataclass
class YAxis:
    """A y axis in plot units (log10 of the values on a log axis; value / scale on a linear one)
    and its labels in real units."""

    lo: float
    hi: float
    ticks: list[float]
    labels: list[str]
    scale: float = 1.0


_HUGE = 1e300   # beyond this, spans and row arithmetic overflow (1e308 - -1e308 is inf)
_LOG_MAX = math.log10(sys.float_info.max)
_LOG_MIN = math.log10(5e-324)   # the smallest float above 0


def plot_scale(lo: float, hi: float) -> float:
    """The unit a linear axis over lo..hi (finite) is drawn in: 1, or a power of ten that brings
    values near the float range (a loss of 1e308) down to a few units."""
    top = max(abs(lo), abs(hi))
    return 1.0 if top < _HUGE else 10.0 ** math.floor(math.log10(top))


def _pow10(v: float) -> float:
    """10 ** v, the largest float where that overflows (log10 of the largest float rounds up)."""
    return 10.0 ** v if v < _LOG_MAX else sys.float_info.max


def y_axis(lo: float, hi: float, rows: int, logy: bool, scale: float = 1.0) -> YAxis:
    """The y axis for shown values lo..hi (in plot units: see `plot_scale`) on `rows` rows: a tick
    every 2 rows or more."""
    if hi <= lo:  # a flat curve: a band around it (a decade on a log axis)
        pad = 0.5 if logy else (abs(lo) * 0.5 or 1.0)
        top = _LOG_MAX if logy else sys.float_info.max / scale   # the band stays inside the float range
        bottom = _LOG_MIN if logy else -top
        lo, hi = max(lo - pad, bottom), min(hi + pad, top)
    n = max(2, rows // 2)
    if logy:
        real = fit_rows([math.log10(v) for v in log_ticks(_pow10(lo), _pow10(hi), n)], lo, hi, rows)
        return YAxis(lo, hi, real, tick_labels([_pow10(v) for v in real]))
    # the evenly spaced set with the most ticks that all get a row of their own (the roundest
    # step of those: fewer asked for first); a tick dropped from the middle would break the spacing
    sets = [linear_ticks(lo, hi, k) for k in range(1, 2 * n + 1)]
    fitting = [t for t in sets if fit_rows(t, lo, hi, rows) == t and len(t) <= n + 1]
    ticks = max(fitting, key=len) if fitting else fit_rows(sets[0], lo, hi, rows)
    return YAxis(lo, hi, ticks, tick_labels([t * scale for t in ticks]), scale)


def tick_row(t: float, lo: float, hi: float, rows: int) -> int:
    """The canvas row (0 = bottom) a y tick lands on, rounded as plotext rounds it."""
    return math.floor(0.5 + (rows - 1) * (t - lo) / (hi - lo)) if hi > lo else 0


def fit_rows(ticks: list[float], lo: float, hi: float, rows: int) -> list[float]:
    """The ticks (ascending) that land on a row of their own: two labels on one row print glued
    together (`2.620.0`), and the one printed last need not be the higher."""
    kept: list[float] = []
    last = -1
    for t in sorted(ticks):
        row = tick_row(t, lo, hi, max(rows, 1))
        if row > last and 0 <= row < max(rows, 1):
            kept.append(t)
            last = row
    return kept


def step_ticks(lo: int, hi: int, cols: int) -> tuple[list[int], list[str]]:
    """Integer x ticks for steps lo..hi on `cols` canvas columns: both ends (the last step is always
    labelled), and evenly spaced round steps between them whose labels fit without touching."""
    if hi <= lo:
        return [lo], tick_labels([lo])

    def span(t: int, label: str) -> tuple[int, int]:
        # where plotext puts a label: centred on its column, pushed inside at the ends
        col = math.floor(0.5 + (cols - 1) * (t - lo) / (hi - lo))
        start = min(max(col - len(label) // 2, 0), cols - len(label) + 1)
        return start, start + len(label)

    def apart(a: tuple[int, int], b: tuple[int, int]) -> bool:
        return a[1] + 3 <= b[0]

    n = max(1, cols // 8)  # a label every 8 columns or more
    while True:
        inner = [int(t) for t in linear_ticks(lo, hi, n, integer=True) if lo < t < hi]
        ticks = [lo, *inner, hi]
        spans = [span(t, label) for t, label in zip(ticks, tick_labels(ticks))]
        # a round step too near an end gives way to it; too near each other, a coarser step
        keep = [i for i in range(1, len(ticks) - 1) if apart(spans[0], spans[i]) and apart(spans[i], spans[-1])]
        if all(apart(spans[i], spans[j]) for i, j in zip(keep, keep[1:])):
            chosen = [lo, *(ticks[i] for i in keep), hi]
            return chosen, tick_labels(chosen)
        if n == 1:
            return [lo, hi], tick_labels([lo, hi])
        n //= 2


# ---------------------------------------------------------------- the x window (zoom): the
# window itself is in tui.state.window, numpy-free, so the app imports it before any plot


def window_slice(x: np.ndarray, lo: float, hi: float) -> slice:
    """The points of an ascending x inside [lo, hi], as a slice (no copy)."""
    return slice(int(np.searchsorted(x, lo, side="left")), int(np.searchsorted(x, hi, side="right")))
