"""The compare view (`mt watch RUN_A RUN_B ...`): the runs' losses overlaid, one colour per run."""
from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Footer
from textual.worker import get_current_worker

from tui.format.fmt import safe_text
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


class CompareApp(PlotKeys, App[int]):
    """Follows several run directories, each with its own Watcher in its own worker."""

    CSS_PATH = ["mt.tcss", "compare.tcss"]   # the dashboard's plot and help styles, then this view's
    TITLE = "mt watch (compare)"
    BINDINGS = [
        Binding("x", "toggle_x", "Step/Tokens", id="toggle-x",
                tooltip="x axis: optimizer step, or tokens seen (runs with different batch sizes compare fairly)"),
        *SMOOTHING_BINDINGS,
        HELP_BINDING,
        Binding("q", "quit", "Quit", id="quit", tooltip="Close the viewer; the runs keep going"),
    ]

    smoothing: reactive[float] = reactive(0.6)
    logy: reactive[bool] = reactive(False)
    x_mode: reactive[str] = reactive("step")

    def __init__(self, run_dirs: list[Path], clock: Callable[[], float] = time.time,
                 poll_s: float = 0.5, redraw_s: float = 0.5) -> None:
        super().__init__()
        self.run_dirs = [Path(d) for d in run_dirs]
        names = [d.name for d in self.run_dirs]
        # two runs of one name (runs/a/x, runs/b/x) are told apart by their paths
        self.names = [safe_text(n) for n in (names if len(set(names)) == len(names) else map(str, self.run_dirs))]
        self.clock = clock
        self.poll_s, self.redraw_s = poll_s, redraw_s
        self.watchers = [Watcher(d) for d in self.run_dirs]
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
        for i in range(len(self.watchers)):
            self.follow(i)
        self.set_interval(self.redraw_s, self.render_frame)

    # ------------------------------------------------------------------ following
    @work(thread=True, group="follow", name="follow run")
    def follow(self, index: int) -> None:
        """Poll run `index` for new bytes; tell the UI when something changed."""
        worker, watcher = get_current_worker(), self.watchers[index]
        first = True
        while not worker.is_cancelled:
            update = watcher.poll(on_quick=lambda: self.post_message(Polled(index)))
            if update.run.changed or update.system_changed or first:
                self.post_message(Polled(index))
                first = False
            worker.cancelled_event.wait(self.poll_s)

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



def run_compare(run_dirs: list[Path]) -> int:
    """Open the compare view until the user quits; the runs themselves keep going."""
    app = CompareApp(run_dirs)
    app.run()
    return app.return_code or 0  # 1 when the app died of an error (Textual printed it)
