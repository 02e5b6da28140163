"""A plot's plotext figure from its curves. numpy and plotext load here, with the first figure."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from plotext._dict import themes as plotext_themes
from rich.text import Text
from textual.color import Color
from textual_plotext import Plot
from textual_plotext.plot import _rgbify_theme, _sequence  # what its PlotextPlot widget uses

from tui.state.plotmath import SmoothCache, YAxis, log_points, minmax_downsample, plot_scale, step_ticks, window_slice, y_axis
from tui.state.window import XWindow, window_range
from tui.widgets.curve import MARK_COLORS, ROWS_SPENT, Curve

if TYPE_CHECKING:
    from textual.app import App


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


MIN_CANVAS = 3  # canvas rows below which the axis names give up their row to the curves


@dataclass
class Shown:
    """One curve's points as drawn, in plot units (log10 y on a log axis)."""

    curve: Curve
    x: np.ndarray
    y: np.ndarray
    smooth_x: np.ndarray | None = None
    smooth_y: np.ndarray | None = None


def draw(plt: Plot, title: str, ylabel: str, curves: list[Curve], width: int, height: int, weight: float,
         logy: bool, hline: float | None, window: XWindow = XWindow(), xlabel: str = "step",
         empty: str = "no data") -> None:
    """Put the curves on a cleared figure of width x height: x spans the window of all curves (its
    last step always labelled), y fits what is shown in it; a log axis plots log10 y with ticks in
    real units. The EMA is of the whole series, cut to the window afterwards. `empty` is said where
    steps came but none with a value to draw (a script that reports no tokens)."""
    plt.clear_data()
    plt.clear_figure()
    marks = [c for c in curves if c.vertical]
    curves = [c for c in curves if not c.vertical]
    rows = height - ROWS_SPENT
    if rows - 1 >= MIN_CANVAS:
        rows -= 1
        plt.xlabel(xlabel)
        plt.ylabel(f"{ylabel} (log)" if logy else ylabel)
    shown, xr = in_window(curves, weight, logy, window)
    # longest first; a window's steps give way before the title is cut
    titles = [title] if xr is None else [f"{window.label()} (steps {xr[0]:,}–{xr[1]:,}) · {title}", f"{window.label()} · {title}"]
    drawn = [p for p in shown if p.x.size and (p.curve.marks_bad or np.isfinite(p.y).any())]
    if not drawn:
        plt.title(fit_title(titles, width - 4))
        said = empty if any(p.x.size for p in shown) else "no data yet"
        plt.text(said, x=0.5, y=0.5)
        plt.xlim(0, 1)
        plt.ylim(0, 1)
        plt.xticks([])
        plt.yticks([])
        return
    lo_x, hi_x = xr or (int(min(p.x[0] for p in drawn)), int(max(p.x[-1] for p in drawn)))
    ys = [float(v) for p in drawn for v in _extremes(p.y)]
    line = None if hline is None or logy and hline <= 0 else math.log10(hline) if logy else hline
    if line is not None:
        ys.append(line)
    scale = plot_scale(min(ys), max(ys)) if ys and not logy else 1.0
    if scale != 1.0:   # values near the float range: drawn in units of `scale`
        drawn = [_scaled(p, scale) for p in drawn]
        ys = [v / scale for v in ys]
        line = None if line is None else line / scale
    if line is not None:
        plt.hline(line, "red")
    ax = y_axis(min(ys), max(ys), rows, logy, scale) if ys else YAxis(0.0, 1.0, [], [])
    cols = max(1, width - 2 - max((len(label) for label in ax.labels), default=1))
    plt.title(fit_title(titles, cols))
    for p in drawn:
        _draw_curve(plt, p, cols, (lo_x, hi_x), weight, ax.hi)
    _draw_marks(plt, marks, lo_x, hi_x)
    plt.ylim(ax.lo, ax.hi)
    plt.yticks(ax.ticks, ax.labels)
    if hi_x > lo_x:
        plt.xlim(lo_x, hi_x)
    else:  # one step: in the middle
        plt.xlim(lo_x - 1, hi_x + 1)
    plt.xticks(*step_ticks(lo_x, hi_x, cols))


def fit_title(titles: list[str], cols: int) -> str:
    """The first of `titles` (longest first) that fits the canvas' width, else the last one cut:
    plotext leaves out a title that is wider."""
    title = next((t for t in titles if len(t) <= cols), titles[-1])
    return title if len(title) <= cols else title[: max(1, cols - 1)] + "…"


def in_window(curves: list[Curve], weight: float, logy: bool,
              window: XWindow) -> tuple[list[Shown], tuple[int, int] | None]:
    """Each curve's points inside the window, smoothed over its whole series first (the EMA does
    not restart at the window's edge); and the window's steps, None for all of them."""
    shown = [_points(c, weight, logy) for c in curves]
    full = [p for p in shown if p.x.size]
    if not full or window.kind == "all":
        return shown, None
    lo, hi = window_range(window, min(float(p.x[0]) for p in full), max(float(p.x[-1]) for p in full))
    return [_cut(p, lo, hi) for p in full], (math.ceil(lo), int(hi))


def _cut(p: Shown, lo: float, hi: float) -> Shown:
    """The points of a curve inside the window [lo, hi]."""
    keep = window_slice(p.x, lo, hi)
    if p.smooth_x is None or p.smooth_y is None:
        return Shown(p.curve, p.x[keep], p.y[keep])
    ks = window_slice(p.smooth_x, lo, hi)
    return Shown(p.curve, p.x[keep], p.y[keep], p.smooth_x[ks], p.smooth_y[ks])


def _scaled(p: Shown, scale: float) -> Shown:
    """A curve's points in units of `scale` (see plotmath.plot_scale)."""
    return Shown(p.curve, p.x, p.y / scale, p.smooth_x, None if p.smooth_y is None else p.smooth_y / scale)


def _extremes(y: np.ndarray) -> list[float]:
    """Min and max of the finite values (none if there is none)."""
    fin = y[np.isfinite(y)]
    return [fin.min(), fin.max()] if fin.size else []


def _points(c: Curve, weight: float, logy: bool) -> Shown:
    """A curve's raw and smoothed points in plot units; on a log axis y <= 0 is left out."""
    x, y = c.series.arrays()
    y = np.array(y)        # copy: the worker may append while we draw
    x = np.array(x[: y.size])
    sx = sy = None
    if c.smooth and weight > 0 and x.size:
        if c.cache is None:
            c.cache = SmoothCache()
        sx, sy = x, c.cache.get(c.series, weight)[: x.size]
        if logy:
            sx, sy = log_points(sx, sy)
    if logy:
        x, y = log_points(x, y)
    return Shown(c, x, y, sx, sy)


def _draw_marks(plt: Plot, marks: list[Curve], lo_x: float, hi_x: float) -> None:
    """A vertical line at each mark inside the x range (a rollback, a knob turned), in its kind's colour."""
    for c in marks:
        xs, ys = c.series.arrays()
        for x, y in zip(xs.tolist(), ys.tolist()):
            if lo_x <= x <= hi_x:
                plt.vline(x, MARK_COLORS[int(y)] if 0 <= y < len(MARK_COLORS) else c.color)


def _draw_curve(plt: Plot, p: Shown, width: int, xr: tuple[float, float], weight: float, top: float) -> None:
    """Draw one curve on `width` canvas columns; its nan/inf points as red x's at `top`."""
    c, x, y = p.curve, p.x, p.y
    raw = minmax_downsample(x, y, width, xr)
    ok = np.isfinite(raw.ymin)
    if c.smooth and ok.any():
        # Raw points as each column's min and max (scatter, not a line: plotext spends
        # time per cell a line crosses, and a zigzag crosses the whole height every column).
        xs = np.concatenate((raw.x[ok], raw.x[ok])).tolist()
        vs = np.concatenate((raw.ymin[ok], raw.ymax[ok])).tolist()
        if c.raw or weight <= 0:
            plt.scatter(xs, vs, color="gray" if weight > 0 else c.color, marker="braille")
        if p.smooth_x is not None and p.smooth_y is not None:
            d = minmax_downsample(p.smooth_x, p.smooth_y, width, xr)
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
    if raw.bad_x.size and c.marks_bad:
        # non-finite points are marked, never dropped silently: a red x on the top edge
        plt.scatter(raw.bad_x.tolist(), [top] * raw.bad_x.size, color="red", marker="x")
