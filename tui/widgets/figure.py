"""A plot's plotext figure from its curves. numpy and plotext load here, with the first figure."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from plotext._dict import themes as plotext_themes
from rich.text import Text
from textual.color import Color
from textual_plotext import Plot
from textual_plotext.plot import _rgbify_theme, _sequence  # what its PlotextPlot widget uses

from tui.state.plotmath import SmoothCache, minmax_downsample

if TYPE_CHECKING:
    from textual.app import App

    from tui.widgets.plots import Curve


def new_plot() -> Plot:
    """An empty plotext figure with no global state."""
    return Plot()


def theme_name(app: App) -> str:
    """The plotext theme for the app's Textual theme, registered as textual_plotext's "auto" does."""
    name = f"textual-auto-{app.theme}"
    if name not in plotext_themes:
        surface = Color.parse(app.theme_variables.get("surface")).rgb
        fg = Color.parse(app.theme_variables.get("foreground")).rgb
        plotext_themes[name] = _rgbify_theme(surface, surface, fg, "default", _sequence)
    return name


def build(plt: Plot, width: int, height: int, app: App) -> Text:
    """The figure as text for a widget of width x height (what PlotextPlot.render does)."""
    plt.plotsize(width, height)
    plt._set_size(width, height)  # textual-plotext does both: resizing misbehaves without it
    plt.theme(theme_name(app))
    return Text.from_ansi(plt.build())


def draw(plt: Plot, title: str, curves: list[Curve], width: int, weight: float, logy: bool,
         hline: float | None) -> None:
    """Put the curves on a cleared figure: x is the span of all curves, y fits what is shown."""
    plt.clear_data()
    plt.clear_figure()
    plt.title(title)
    plt.yscale("log" if logy else "linear")
    lo_x = hi_x = None
    for c in curves:
        x, _ = c.series.arrays()
        if x.size:
            lo_x = x[0] if lo_x is None else min(lo_x, x[0])
            hi_x = x[-1] if hi_x is None else max(hi_x, x[-1])
    if lo_x is None:
        plt.text("no data yet", x=0.5, y=0.5)
        plt.xlim(0, 1)
        plt.ylim(0, 1)
        return
    xr = (float(lo_x), float(hi_x))
    ys: list[float] = []
    for c in curves:
        ys += _draw_curve(plt, c, width, xr, weight, logy)
    if hline is not None and (not logy or hline > 0):
        plt.hline(hline, "red")
        ys.append(hline)
    if ys:
        lo, hi = min(ys), max(ys)
        if lo == hi:
            lo, hi = (lo * 0.5, hi * 2) if logy else (lo - 1, hi + 1)
        plt.ylim(lo, hi)
    if xr[1] > xr[0]:
        plt.xlim(*xr)


def _draw_curve(plt: Plot, c: Curve, width: int, xr: tuple[float, float], weight: float, logy: bool) -> list[float]:
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
    if c.smooth and ok.any():
        # Raw points as each column's min and max (scatter, not a line: plotext spends
        # time per cell a line crosses, and a zigzag crosses the whole height every column).
        xs = np.concatenate((raw.x[ok], raw.x[ok])).tolist()
        vs = np.concatenate((raw.ymin[ok], raw.ymax[ok])).tolist()
        plt.scatter(xs, vs, color="gray" if weight > 0 else c.color, marker="braille")
        if weight > 0:
            if c.cache is None:
                c.cache = SmoothCache()
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
