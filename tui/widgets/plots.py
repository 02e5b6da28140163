"""Metric plots: raw series dim, debiased-EMA smoothed on top, min/max downsampled to the width.

The widget itself is light. numpy and plotext come with the first figure (`tui.widgets.figure`),
which is drawn after the dashboard's first frame: the header never waits for them.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import RenderResult
from textual.widget import Widget

from tui.state.window import XWindow  # numpy-free
from tui.widgets.curve import ROWS_SPENT, Curve

if TYPE_CHECKING:
    from textual_plotext import Plot


class MetricPlot(Widget, can_focus=True):
    """A plot of one or more curves that redraws only when its data or view changed."""

    DEFAULT_CSS = """
    MetricPlot {
        width: 1fr;
        height: 1fr;
    }
    """

    def __init__(self, title: str, ylabel: str, curves: list[Curve], hline: float | None = None,
                 empty: str = "no data", **kw) -> None:
        super().__init__(**kw)
        self.title = title
        self.empty = empty          # said where steps came with nothing to draw
        self.ylabel = ylabel
        self.curves = curves
        self.hline = hline
        self.xlabel = "step"
        self.build_s = 0.0          # cost of the last plotext build
        self._plt: Plot | None = None
        self._key: tuple | None = None
        self._rendered: RenderResult | None = None
        self._rendered_sig: tuple | None = None

    def on_mount(self) -> None:
        # `render` keys on the theme; a theme change must reach it
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.refresh())

    @property
    def plt(self) -> Plot:
        """The plotext figure, made on first use."""
        if self._plt is None:
            from tui.widgets.figure import new_plot
            self._plt = new_plot()
        return self._plt

    def render(self) -> RenderResult:
        """The built figure, rebuilt only after `redraw` changed it or the size changed."""
        if self._key is None:
            return ""  # nothing drawn yet: a first frame builds no figure
        if self.size.height <= ROWS_SPENT:  # no row left for a curve: plotext would draw garbage
            return Text(f"{self.title}: too small to plot", style="dim")
        sig = (self._key, self.size, self.app.theme)
        if self._rendered is not None and sig == self._rendered_sig:
            return self._rendered
        t0 = time.perf_counter()
        try:
            from tui.widgets.figure import build
            out: RenderResult = build(self.plt, self.size.width, self.size.height, self.app)
        except Exception as e:  # noqa: BLE001 - a plot that cannot draw says so in place
            out = Text(f"{self.title}: cannot draw ({type(e).__name__})", style="dim")
        self.build_s = time.perf_counter() - t0
        self._rendered, self._rendered_sig = out, sig
        return out

    def drawn_current(self, window: XWindow | None = None) -> bool:
        """The figure shows the newest data of every curve (in `window`, when given)."""
        return (self._key is not None and self._key[0] == tuple(c.series.version for c in self.curves)
                and self._key[1][:2] == (self.size.width, self.size.height)
                and (window is None or self._key[1][5] == window))

    def data_version(self) -> tuple:
        """The versions of its curves' data: changes whenever a point is added."""
        return tuple(c.series.version for c in self.curves)

    def redraw(self, weight: float, logy: bool, window: XWindow | None = None, force: bool = False,
               due: bool = True) -> bool:
        """Rebuild the plotext figure if anything it shows changed; True if it did.

        New points alone wait for `due` (the viewer's one `Pacing` for all its plots); a change of
        view (keys, size, window) or a new history (a big run's full read, a resumed attempt) does not."""
        window = window or XWindow()
        # what it shows (title, which series) is part of the view: `x` swaps in a metric whose
        # data version may equal the last one's, and must still redraw at once
        view = (self.size.width, self.size.height, weight, logy, self.hline, window, self.xlabel,
                self.title, self.ylabel, tuple((c.label, id(c.series)) for c in self.curves))
        key = (self.data_version(), view, tuple(c.series.generation for c in self.curves))
        if key == self._key and not force:
            return False
        if not force and not due and self._key is not None and self._key[1:] == key[1:]:
            return False
        self._key = key
        from tui.widgets.figure import draw
        draw(self.plt, self.title, self.ylabel, self.curves, self.size.width, self.size.height, weight, logy,
             self.hline, window, self.xlabel, self.empty)
        self.refresh()
        return True
