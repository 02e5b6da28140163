"""Metric plots: raw series dim, debiased-EMA smoothed on top, min/max downsampled to the width."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
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


class MetricPlot(PlotextPlot):
    """A plot of one or more curves that redraws only when its data or view changed."""

    def __init__(self, title: str, curves: list[Curve], hline: float | None = None, **kw) -> None:
        super().__init__(**kw)
        self.title = title
        self.curves = curves
        self.hline = hline
        self._key: tuple | None = None

    def redraw(self, weight: float, logy: bool, force: bool = False) -> bool:
        """Rebuild the plotext figure if anything it shows changed; True if it did."""
        width = max(1, self.size.width - AXIS_COLS)
        key = (tuple(c.series.version for c in self.curves), width, self.size.height, weight, logy, self.hline)
        if key == self._key and not force:
            return False
        self._key = key
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
        x, y = c.series.arrays()
        if not x.size:
            return []
        y = np.array(y)        # copy: the worker may append while we draw
        x = np.array(x[: y.size])
        if logy:
            y = np.where(y > 0, y, np.nan)
        raw = minmax_downsample(x, y, width, xr)
        bad = raw.bad_x
        out: list[float] = []
        smooth = c.smooth and weight > 0
        if c.smooth:
            xs, vs = raw.zigzag()
            if xs:
                plt_color = "gray" if smooth else c.color
                self.plt.plot(xs, vs, color=plt_color, marker="braille", label=None if smooth else c.label)
                out += [min(vs), max(vs)]
        else:
            ok = np.isfinite(y)
            if ok.any():
                self.plt.plot(x[ok].tolist(), y[ok].tolist(), color=c.color, marker="dot", label=c.label)
                out += [float(y[ok].min()), float(y[ok].max())]
        if smooth:
            s = c.cache.get(c.series, weight)[: x.size]
            if logy:
                s = np.where(s > 0, s, np.nan)
            d = minmax_downsample(x, s, width, xr)
            # the smoothed curve is drawn through column means of its extremes: a line, not a band
            ok = np.isfinite(d.ymin)
            if ok.any():
                mid = ((d.ymin[ok] + d.ymax[ok]) / 2).tolist()
                self.plt.plot(d.x[ok].tolist(), mid, color=c.color, marker="braille", label=c.label)
        if bad.size and out:
            # non-finite points: a red ✗ on the top edge of the column they fall in
            top = max(out)
            self.plt.scatter(bad.tolist(), [top] * bad.size, color="red", marker="x",
                             label=f"{c.label} nan/inf")
        return out
