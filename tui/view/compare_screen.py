"""The compare screen (`mt watch RUN_A RUN_B ...`): the runs' losses overlaid, one colour per run,
its layout and its keys; the App that follows the runs is tui/view/compare.py."""
from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer

from tui.read.watcher import Watcher
from tui.state.compare import run_color, run_line, x_series
from tui.state.pacing import Pacing
from tui.view.plotkeys import HELP_BINDING, SMOOTHING_BINDINGS, PlotKeys
from tui.widgets.curve import Curve
from tui.widgets.legend import CompareLegend
from tui.widgets.plots import MetricPlot

LOCK_WAIT_S = 0.05   # a poll holds a watcher's lock for ms; a frame that cannot have them all waits a tick
X_LABELS = {"step": "step", "tokens": "tokens seen"}


@dataclass
class Polled(Message):
    """Run `index`'s worker read something new."""

    index: int


class CompareScreen(PlotKeys, Screen[None]):
    """The runs' losses overlaid and their table; its keys pick the x axis, smoothing and log-y.
    The App follows each run in a worker and tells this screen when one read something."""

    BINDINGS = [
        Binding("x", "toggle_x", "Step/Tokens", id="toggle-x",
                tooltip="x axis: optimizer step, or tokens seen (runs with different batch sizes compare fairly)"),
        *SMOOTHING_BINDINGS,
        HELP_BINDING,
        Binding("q", "app.quit", "Quit", id="quit", tooltip="Close the viewer; the runs keep going"),
    ]

    smoothing: reactive[float] = reactive(0.6)
    logy: reactive[bool] = reactive(False)
    x_mode: reactive[str] = reactive("step")

    def __init__(self, names: list[str], watchers: list[Watcher], redraw_s: float = 0.5,
                 mounted: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.names, self.watchers, self.redraw_s, self._mounted = names, watchers, redraw_s, mounted
        self.polled = [False] * len(self.watchers)   # each run's first poll is done (tests wait on it)
        self.left_out: list[str] = []                # runs the tokens axis cannot place (tokens/step unknown)
        self._tps: tuple[int | None, ...] = ()

    @property
    def loaded(self) -> bool:
        return all(self.polled)

    def compose(self) -> ComposeResult:
        yield CompareLegend("reading the runs…", id="compare-legend")
        with Vertical(id="compare-plots"):
            yield MetricPlot("loss", "loss", [], id="compare-loss")
        yield Footer()

    def on_mount(self) -> None:
        self._legend = self.query_one(CompareLegend)
        self._plot = self.query_one("#compare-loss", MetricPlot)
        # One plot the size of the screen: a plotext build costs ~0.1 s at 140x44, so while points
        # stream it redraws every 4 s; a quiet run catches up at once.
        # Each run polls twice a second (the header's rate): 8 polls a second cost ~1% of a core more.
        self.pacing = Pacing(min_interval_s=4.0)
        self.query_one("#compare-plots").border_title = "loss: train (line), val (dots); one colour per run"
        self._set_curves()
        self._mounted()  # the App starts following the runs: their news has a screen to go to
        self.set_interval(self.redraw_s, self.render_frame)

    # ------------------------------------------------------------------ following
    @on(Polled)
    def _polled(self, message: Polled) -> None:
        first = not self.polled[message.index]
        self.polled[message.index] = True
        if first:  # a big run's worker waits for a first frame before its bulk read
            self.render_frame()
            self.call_after_refresh(self.watchers[message.index].frame_shown.set)

    # ------------------------------------------------------------------ drawing
    def _locks(self, stack: ExitStack) -> bool:
        """Hold every watcher's lock (on `stack`); False when one is busy for longer than LOCK_WAIT_S."""
        for w in self.watchers:
            lock: threading.RLock = w.lock
            if not lock.acquire(timeout=LOCK_WAIT_S):
                return False
            stack.callback(lock.release)
        return True

    def _set_curves(self) -> None:
        """The plot's curves for the x mode: each run's train loss and val loss in its colour."""
        curves, left_out = [], []
        for i, (name, w) in enumerate(zip(self.names, self.watchers)):
            st, series = w.follower.state, w.follower.series
            train, val = x_series(series.loss, st, self.x_mode), x_series(series.val_loss, st, self.x_mode)
            if train is None or val is None:
                left_out.append(name)
                continue
            color, _ = run_color(i)
            curves += [Curve(name, train, color, raw=False), Curve(f"{name} val", val, color, smooth=False)]
        self._tps = tuple(w.follower.state.tokens_per_step for w in self.watchers)
        self.left_out = left_out
        self._plot.curves = curves
        self._plot.xlabel = X_LABELS[self.x_mode]
        other = "step" if self.x_mode == "tokens" else "tokens seen"
        self._plot.title = f"loss vs {X_LABELS[self.x_mode]}  (press x for {other})"

    def render_frame(self) -> None:
        """The header now, the plot after this refresh (when its pacing says)."""
        if not any(self.polled):
            return
        with ExitStack() as stack:
            if not self._locks(stack):
                return
            if self.x_mode == "tokens" and self._tps != tuple(w.follower.state.tokens_per_step for w in self.watchers):
                self._set_curves()   # a run's run_start came: its tokens per step are known now
            lines = [run_line(name, w.follower.state) for name, w in zip(self.names, self.watchers)]
            self._legend.show(lines, self._note())
        self.call_after_refresh(self._redraw_plot)

    def _note(self) -> str:
        note = f"x: {X_LABELS[self.x_mode]}  smoothing {self.smoothing:.2f}  log-y {'on' if self.logy else 'off'}"
        if self.left_out:
            note += f"  not on the tokens axis (tokens per step unknown): {', '.join(self.left_out)}"
        return note

    def _redraw_plot(self, force: bool = False) -> None:
        with ExitStack() as stack:
            if self._locks(stack):
                now = time.monotonic()
                due = self.pacing.due(self._plot.data_version(), self._plot.build_s, now)
                if self._plot.redraw(self.smoothing, self.logy, force=force, due=due):
                    self.pacing.drawn(now)

    def settled(self) -> bool:
        """Everything read so far is on screen (tests and benchmarks wait for this)."""
        return self.loaded and all(w.history_ready for w in self.watchers) and self._plot.drawn_current()

    # ------------------------------------------------------------------ actions
    def action_toggle_x(self) -> None:
        self.x_mode = "tokens" if self.x_mode == "step" else "step"

    def watch_x_mode(self) -> None:
        if hasattr(self, "_plot"):
            self._set_curves()
            self.render_frame()

    def watch_smoothing(self) -> None:
        self.render_frame()

    def watch_logy(self) -> None:
        self.render_frame()
