"""The dashboard's view: its layout for the terminal size, tabs, and the keys that change what
the plots show (smoothing, log-y, the x window, which small plot). Mixed into `tui.app.MtApp`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tui.format import safe_text
from tui.state.layout import MIN_H, MIN_W, choose_layout, strip_items
from tui.state.window import narrow, next_window, widen
from tui.widgets.plots import Curve, MetricPlot

if TYPE_CHECKING:
    from tui.app import MtApp

PANELS = {1: "#plot-loss", 2: "#system", 3: "#incident-list", 4: "#logs", 5: "#plots-small"}
LAYOUTS = ("too-small", "tabs", "side-tabs", "full")


class ViewKeys:
    """Layout and plot-view actions of the app (state lives on the app: layout_name, tabs, window)."""

    def _apply_size(self: MtApp, w: int, h: int) -> None:
        self.layout_name = choose_layout(w, h)
        if self.layout_name == "too-small":
            self._too_small.update(
                f"Terminal {w}×{h} is too small for the dashboard (need {MIN_W}×{MIN_H}).\n"
                "Enlarge the window, or use `mt watch --once`. q quits.")
        self._show_tabs()

    def _show_tabs(self: MtApp) -> None:
        """The layout's classes on the main screen (even while a dialog is on top), the strip."""
        screen = self._main_screen
        for name in LAYOUTS:
            screen.set_class(name == self.layout_name, name)
        active = self.tabs.active(self.layout_name)
        for n in PANELS:
            screen.set_class(n == active, f"tab-{n}")
        self._show_strip()
        self._dirty = True

    def _show_strip(self: MtApp) -> None:
        n_open = sum(1 for i in self.watcher.follower.state.incidents if i.status == "open")
        self._tabstrip.show(strip_items(self.layout_name, self.tabs.active(self.layout_name), n_open))

    def action_toggle_throughput(self: MtApp) -> None:
        lr, tps = self.query_one("#plot-lr", MetricPlot), self.query_one("#plot-tps", MetricPlot)
        lr.display, tps.display = tps.display, lr.display
        self.render_frame()

    def action_next_metric(self: MtApp) -> None:
        """The next of the script's own metrics (by name) in the small plot on the left; after the last, back."""
        extra = self.query_one("#plot-extra", MetricPlot)
        series = self.watcher.follower.series.extra
        names = sorted(series)
        if not names:
            self.say("no metrics of the script's own in this run: run.step(..., name=value) or run.log({...}) adds them")
            return
        later = [n for n in names if self._extra_at is None or n > self._extra_at]
        if not later:  # after the last one: what was there before
            self._extra_at, extra.display = None, False
            for plot in self._extra_hid:
                plot.display = True
            self._extra_hid = []
        else:
            if self._extra_at is None:
                self._extra_hid = [p for p in (self.query_one("#plot-lr", MetricPlot), self.query_one("#plot-tps", MetricPlot))
                                   if p.display]
                for plot in self._extra_hid:
                    plot.display = False
            self._extra_at = later[0]
            extra.title, extra.ylabel = f"{safe_text(later[0])}  (x: next)", safe_text(later[0])
            extra.curves = [Curve(later[0], series[later[0]], "blue")]
            extra.display = True
            extra.redraw(self.smoothing, self.logy, self.window, force=True)
        self.render_frame()

    def _shown_plots(self: MtApp) -> list[MetricPlot]:
        """The plots on screen: a hidden one (or one in a hidden tab) is not redrawn (nor waited for)."""
        return [p for p in self._plots if all(w.display for w in p.ancestors_with_self if hasattr(w, "display"))]

    def watch_smoothing(self: MtApp) -> None:
        self.render_frame()

    def watch_logy(self: MtApp) -> None:
        self.render_frame()

    def watch_window(self: MtApp) -> None:
        self.render_frame()

    def action_next_window(self: MtApp) -> None:
        self.window = next_window(self.window)

    def action_narrow(self: MtApp) -> None:
        self.window = narrow(self.window)

    def action_widen(self: MtApp) -> None:
        # the run's newest step as its span: the series belong to the worker while it reads
        self.window = widen(self.window, float(self.watcher.follower.state.step or 0))

    def action_focus_panel(self: MtApp, n: int) -> None:
        """Show tab n where panels are tabs, and focus it."""
        tabs = self.tabs.select(self.layout_name, n)
        if tabs != self.tabs:
            self.tabs = tabs
            self._show_tabs()
            self.call_after_refresh(self.render_frame)
        target = self.query_one(PANELS[n])
        if n == 5:  # the first small plot on screen
            target = next((p for p in self._shown_plots() if p.id != "plot-loss"), target)
        self.call_after_refresh(target.focus, False)  # no scroll: the panel is the pane

    def action_next_tab(self: MtApp) -> None:
        """Tab: the next tab in a tabbed layout; elsewhere (and in dialogs) the next widget."""
        tabs = self.tabs.next(self.layout_name)
        if self.screen is not self._main_screen or tabs == self.tabs:
            self.screen.focus_next()
            return
        n = tabs.active(self.layout_name)
        if n is not None:
            self.action_focus_panel(n)
