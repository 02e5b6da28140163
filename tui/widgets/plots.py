"""Metric plots: raw series dim, debiased-EMA smoothed on top, min/max downsampled to the width."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from tui.series import Series, SmoothCache, minmax_downsample

AXIS_COLS = 12  # cells plotext spends on the y tick labels


@dataclass
class Curve:
    """One series on a plot; `smooth` False for sparse ones like validation loss."""

    label: str
    series: Series
    color: str
    smooth: bool = True
    cache: SmoothCache = field(default_factory=SmoothCache)


class MetricPlot(PlotextPlot, can_focus=True):
    """A plot of one or more curves that redraws only when its data or view changed."""

    def __init__(self, title: str, curves: list[Curve], hline: float | None = None, **kw) -> None:
        super().__init__(**kw)
        self.title = title
        self.curves = curves
        self.hline = hline
        self.min_interval_s = 2.0
        self.build_s = 0.0          # cost of the last plotext build
        self._key: tuple | None = None
        self._last_draw = 0.0
        self._rendered: RenderResult | None = None
        self._rendered_sig: tuple | None = None

    def render(self) -> RenderResult:
        """The built figure, rebuilt only after `redraw` changed it or the size changed."""
        sig = (self._key, self.size, self.app.theme)
        if self._rendered is not None and sig == self._rendered_sig:
            return self._rendered
        t0 = time.perf_counter()
        try:
            out = super().render()
        except Exception as e:  # noqa: BLE001 - plotext corner cases must never kill the app
            out = Text(f"{self.title}: cannot draw ({type(e).__name__})", style="dim")
        self.build_s = time.perf_counter() - t0
        self._rendered, self._rendered_sig = out, sig
        return out

    def drawn_current(self) -> bool:
        """The figure shows the newest data of every curve."""
        return (self._key is not None and self._key[0] == tuple(c.series.version for c in self.curves)
                and self._key[1][:2] == (max(1, self.size.width - AXIS_COLS), self.size.height))

    def redraw(self, weight: float, logy: bool, force: bool = False) -> bool:
        """Rebuild the plotext figure if anything it shows changed; True if it did."""
        width = max(1, self.size.width - AXIS_COLS)
        view = (width, self.size.height, weight, logy, self.hline)
        key = (tuple(c.series.version for c in self.curves), view)
        if key == self._key and not force:
            return False
        now = time.monotonic()
        # New data alone waits its turn: a plotext build costs tens of ms, so data-driven
        # redraws are spaced to keep the viewer's CPU small. Key presses and resizes are immediate.
        if not force and self._key is not None and self._key[1] == view and \
                now - self._last_draw < max(self.min_interval_s, 25 * self.build_s):
            return False
        self._key, self._last_draw = key, now
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.yscale("log" if logy else "linear")
        lo_x = hi_x = None
        for c in self.curves:
            x, _ = c.series.arrays()
            if x.size:
                lo_x = x[0] if lo_x is None else min(lo_x, x[0])
                hi_x = x[-1] if hi_x is None else max(hi_x, x[-1])
        if lo_x is None:
            plt.text("no data yet", x=0.5, y=0.5)
            plt.xlim(0, 1)
            plt.ylim(0, 1)
            self.refresh()
            return True
        xr = (float(lo_x), float(hi_x))
        ys: list[float] = []
        for c in self.curves:
            ys += self._draw_curve(c, width, xr, weight, logy)
        if self.hline is not None and (not logy or self.hline > 0):
            plt.hline(self.hline, "red")
            ys.append(self.hline)
        if ys:
            lo, hi = min(ys), max(ys)
            if lo == hi:
                lo, hi = (lo * 0.5, hi * 2) if logy else (lo - 1, hi + 1)
            plt.ylim(lo, hi)
        if xr[1] > xr[0]:
            plt.xlim(*xr)
        self.refresh()
        return True

    def _draw_curve(self, c: Curve, width: int, xr: tuple[float, float], weight: float, logy: bool) -> list[float]:
        """Draw one curve; returns the y values that must fit in the view."""
        x, y = c.series.arrays()
        if not x.size:
            return []
        y = np.array(y)        # copy: the worker may append while we draw
        x = np.array(x[: y.size])
        if logy:
            y = np.where(y > 0, y, np.nan)
        raw = minmax_downsample(x, y, width, xr)
        ok = np.isfinite(raw.ymin)
        if not ok.any():
            out: list[float] = []
        else:
            out = [float(raw.ymin[ok].min()), float(raw.ymax[ok].max())]
        plt = self.plt
        if c.smooth and ok.any():
            # Raw points as each column's min and max (scatter, not a line: plotext spends
            # time per cell a line crosses, and a zigzag crosses the whole height every column).
            xs = np.concatenate((raw.x[ok], raw.x[ok])).tolist()
            vs = np.concatenate((raw.ymin[ok], raw.ymax[ok])).tolist()
            plt.scatter(xs, vs, color="gray" if weight > 0 else c.color, marker="braille")
            if weight > 0:
                sm = c.cache.get(c.series, weight)[: x.size]
                if logy:
                    sm = np.where(sm > 0, sm, np.nan)
                d = minmax_downsample(x, sm, width, xr)
                good = np.isfinite(d.ymin)
                if good.any():  # a smoothed curve barely moves within a column: draw its middle
                    mid = ((d.ymin[good] + d.ymax[good]) / 2).tolist()
                    plt.plot(d.x[good].tolist(), mid, color=c.color, marker="braille")
        elif ok.any():
            fin = np.isfinite(y)
            if int(fin.sum()) <= width:   # sparse (validation loss): every point, joined
                plt.plot(x[fin].tolist(), y[fin].tolist(), color=c.color, marker="dot")
            else:
                mid = ((raw.ymin[ok] + raw.ymax[ok]) / 2).tolist()
                plt.plot(raw.x[ok].tolist(), mid, color=c.color, marker="braille")
        if raw.bad_x.size:
            # non-finite points are marked, never dropped silently: a red x on the top edge
            top = out[1] if out else 1.0
            plt.scatter(raw.bad_x.tolist(), [top] * raw.bad_x.size, color="red", marker="x")
        return out
