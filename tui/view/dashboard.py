"""The dashboard screen: its widgets, layout for the terminal size, tabs, the keys that change what it
shows (smoothing, log-y, the x window, which small plot, which rank's log), the run's control keys
(policy: tui/state/requests.py) and what it tells the user."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static

from mt.contract.status import FINAL_STATES
from tui.format.fmt import safe_text
from tui.read.watcher import Watcher, WatchUpdate
from tui.state.layout import MIN_H, MIN_W, Tabs, choose_layout, strip_items
from tui.state.pacing import Pacing
from tui.state.requests import Note, RequestBook, refusal
from tui.state.window import XWindow, narrow, next_window, widen
from tui.view.knobkeys import KNOB_BINDING, KnobKeys
from tui.view.messages import ControlAsked, ControlDone
from tui.view.panelkeys import FOCUS_BINDINGS
from tui.view.plotkeys import HELP_BINDING, SMOOTHING_BINDINGS, PlotKeys
from tui.view.rollbackkey import ROLLBACK_BINDING, RollbackKey
from tui.view.samplekeys import SAMPLES_BINDING, SampleKeys
from tui.widgets.curve import Curve
from tui.widgets.dialogs import ConfirmScreen
from tui.widgets.header import RunHeader
from tui.widgets.incidents import IncidentsPanel
from tui.widgets.logs import LogsPanel
from tui.widgets.notice import Notice, notice_text
from tui.widgets.plots import MetricPlot
from tui.widgets.system import SystemPanel
from tui.widgets.tabstrip import TabStrip

PANELS = {1: "#plot-loss", 2: "#system", 3: "#incident-list", 4: "#logs", 5: "#plots-small"}
LAYOUTS, LOCK_WAIT_S = ("too-small", "tabs", "side-tabs", "full"), 0.05  # a poll holds the watcher's lock for ms; a bulk load reads without it


class DashboardScreen(KnobKeys, PlotKeys, SampleKeys, RollbackKey, Screen[None]):
    """Shows one run as its watcher has read it and decides its control requests; the App follows
    the run and runs the workers (kill, resume, stacks) this screen asks for."""

    BINDINGS = [
        Binding("c", "checkpoint", "Checkpoint", id="checkpoint", tooltip="Save a checkpoint now"),
        Binding("s", "stop", "Stop", id="stop", tooltip="Graceful stop with a final checkpoint"),
        Binding("k", "kill", "Kill", id="kill", tooltip="Terminate every process of the run (asks first)"),
        Binding("r", "resume", "Resume", id="resume", tooltip="New attempt from the newest checkpoint"),
        ROLLBACK_BINDING, KNOB_BINDING,
        *SMOOTHING_BINDINGS,
        Binding("t", "toggle_throughput", "Tok/s", id="throughput",
                tooltip="Plot tokens/s in place of the learning rate (and back)"),
        Binding("x", "next_metric", "Metrics", id="next-metric",
                tooltip="Plot the script's own metrics, one after another, in place of the learning rate"),
        Binding("w", "next_window", "Window", id="window",
                tooltip="Steps the plots show: all / the last 10% / the last 1,000 (following the newest)"),
        Binding("left_square_bracket", "narrow", "Narrow", show=False, id="narrow", key_display="[",
                tooltip="Half the plots' window of steps"),
        Binding("right_square_bracket", "widen", "Widen", show=False, id="widen", key_display="]",
                tooltip="Twice the plots' window of steps (up to all of them)"),
        Binding("g", "next_rank", "Next log", id="next-rank", tooltip="Show the next rank's log"),
        Binding("p", "stacks", "Stacks", show=False, id="stacks",
                tooltip="Capture every rank's stack now (RUN/stacks/) and show the verdict"),
        *FOCUS_BINDINGS,
        Binding("tab", "next_tab", "Next tab", show=False, id="next-tab", priority=True, key_display="Tab",
                tooltip="Next tab where panels are tabs (small terminals); next widget elsewhere"),
        SAMPLES_BINDING, HELP_BINDING,
        Binding("q", "app.quit", "Quit", id="quit", tooltip="Close the viewer; the run keeps going"),
    ]

    smoothing: reactive[float] = reactive(0.6)
    logy: reactive[bool] = reactive(False)
    window: reactive[XWindow] = reactive(XWindow)

    def __init__(self, run_dir: Path, watcher: Watcher, clock: Callable[[], float], redraw_s: float,
                 mounted: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.run_dir, self.run_name = run_dir, run_dir.name
        self.watcher, self.clock, self.redraw_s, self._mounted = watcher, clock, redraw_s, mounted
        self.requests = RequestBook()         # the control requests this viewer sent
        self.said: list[tuple[str, str]] = []  # (severity, text) of every notification, oldest first
        self.loaded = False                   # first poll shown (tests wait on it)
        self._dirty = True
        self._auto_rank_done = False
        self.layout_name = "full"
        self.tabs = Tabs()
        self.pacing = Pacing()                # when the plots redraw for new points

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        series = self.watcher.follower.series
        st = self.watcher.follower.state
        yield RunHeader(f"{safe_text(self.run_name)}  reading the run…", id="header")
        yield Notice(id="notice")
        yield TabStrip("", id="tabstrip")
        with Horizontal(id="main"):
            with Vertical(id="plots"):
                yield MetricPlot("loss: train (cyan, raw grey), val (orange)", "loss", [
                    Curve("train", series.loss, "cyan"),
                    Curve("val", series.val_loss, "orange", smooth=False), Curve("marks", series.marks, "red", vertical=True)], id="plot-loss")
                with Horizontal(id="plots-small"):
                    # a script may report neither: its steps are then gaps, not a row of red x's
                    yield MetricPlot("learning rate", "lr", [Curve("lr", series.lr, "green", smooth=False, marks_bad=False)],
                                     empty="no learning rate reported", id="plot-lr")
                    yield MetricPlot("tokens/s", "tokens/s",
                                     [Curve("tokens/s", series.tokens_per_s, "yellow", marks_bad=False)],
                                     empty="no token counts reported", id="plot-tps")
                    yield MetricPlot("metric", "value", [], id="plot-extra")
                    yield MetricPlot("grad norm (red line: clip)", "grad norm",
                                     [Curve("grad_norm", series.grad_norm, "magenta")], hline=st.grad_clip,
                                     id="plot-grad")
            with Vertical(id="side"):
                yield SystemPanel(id="system")
                yield IncidentsPanel(id="incidents")
                yield LogsPanel(id="logs")
        yield Static("", id="too-small")
        yield Footer()

    def on_mount(self) -> None:
        self._header = self.query_one(RunHeader)
        self._notice = self.query_one(Notice)
        self._plots = list(self.query(MetricPlot))
        self._grad = self.query_one("#plot-grad", MetricPlot)
        self.query_one("#plot-tps").display = False   # until `t` swaps it for the learning rate
        self.query_one("#plot-extra").display = False  # until `x` shows a script's own metric
        self._extra_at: str | None = None              # the metric it shows
        self._extra_hid: list[MetricPlot] = []         # what it stands in for
        self._system = self.query_one(SystemPanel)
        self._incidents = self.query_one(IncidentsPanel)
        self._logs = self.query_one(LogsPanel)
        self._too_small = self.query_one("#too-small", Static)
        self._tabstrip = self.query_one(TabStrip)
        self.query_one("#system").border_title = "2 system"
        self.query_one("#incidents").border_title = "3 incidents"
        self.query_one("#plots").border_title = "1 plots"
        self.query_one("#logs").border_title = "4 logs: rank0.log  (g: next rank)"
        self._apply_size(self.app.size.width, self.app.size.height)
        self._mounted()  # the App reads a small run now, before the first paint, and starts following
        self.set_interval(self.redraw_s, self.render_frame)

    def on_resize(self, event: Resize) -> None:
        if hasattr(self, "_tabstrip"):
            self._apply_size(event.size.width, event.size.height)
            # the header's bar and the plots fit the new size once it is laid out, not a tick later
            self.call_after_refresh(self.render_frame)

    def _apply_size(self, w: int, h: int) -> None:
        self.layout_name = choose_layout(w, h)
        if self.layout_name == "too-small":
            self._too_small.update(
                f"Terminal {w}×{h} is too small for the dashboard (need {MIN_W}×{MIN_H}).\n"
                "Enlarge the window, or use `mt watch --once`. q quits.")
        self._show_tabs()

    def _show_tabs(self) -> None:
        """The layout's classes on this screen (even while a dialog is on top), the strip."""
        for name in LAYOUTS:
            self.set_class(name == self.layout_name, name)
        active = self.tabs.active(self.layout_name)
        for n in PANELS:
            self.set_class(n == active, f"tab-{n}")
        self._show_strip()
        self._dirty = True

    def _show_strip(self) -> None:
        n_open = sum(1 for i in self.watcher.follower.state.incidents if i.status == "open")
        self._tabstrip.show(strip_items(self.layout_name, self.tabs.active(self.layout_name), n_open))

    # ------------------------------------------------------------------ drawing
    def show_update(self, u: WatchUpdate) -> None:
        """What the worker read: drawn at once the first time, at the next frame after that."""
        for ev in u.run.new_events:
            note = self.requests.answer(ev)
            if note is not None:
                self.say(note.text, note.severity, note.title)
        first = not self.loaded
        self.loaded = True
        self._dirty = True
        if first:  # draw now rather than at the next tick, and tell the worker it is shown
            self.render_frame()
            self.call_after_refresh(self.watcher.frame_shown.set)
        self._logs.show(self.watcher.log_rank, u.new_log_lines, u.log_reset, u.log_pending)
        st = self.watcher.follower.state
        if st.state in ("failed", "killed") and not self._auto_rank_done:
            # show the failing rank's log without being asked; until the rules' exit incident
            # names it (it may come after the state), the reason's rank may only have lost its peer
            self._auto_rank_done = st.exit_incident() is not None
            rank = st.failing_rank()
            if rank is not None and rank != self.watcher.log_rank:
                self.watcher.set_log_rank(rank)

    def follow_failing_rank(self) -> None:
        """Show the failing rank's log again when it fails (a resumed run is a new attempt)."""
        self._auto_rank_done = False

    def render_frame(self) -> None:
        """Redraw at a bounded rate; skips until the first poll, and if the worker holds the
        state longer than LOCK_WAIT_S."""
        if not self.loaded or not self.watcher.lock.acquire(timeout=LOCK_WAIT_S):
            return
        try:
            now = self.clock()
            st = self.watcher.follower.state
            self._header.show(st, now, self.smoothing, self.logy, self.window.label())
            self._notice.say(notice_text(st, self.watcher.log_lines(), self.watcher.log_rank))
            self.set_class(self._notice.display, "notice-shown")
            self._grad.hline = st.grad_clip
            # plots after this refresh: a first frame of a huge run shows the header at once
            self.call_after_refresh(self._redraw_plots)
            if self._dirty:
                ended = st.shown_state if st.state in FINAL_STATES or st.supervisor_lost else None
                self._system.show(self.watcher.system, ended, now, sampled=not st.status.by_script,
                                  nodes=self.watcher.nodes, run=st)
                self._incidents.show(st.incidents, now, st.causes)
                self._show_strip()
                self._dirty = False
        finally:
            self.watcher.lock.release()

    def _redraw_plots(self) -> None:
        if not self.watcher.lock.acquire(timeout=LOCK_WAIT_S):
            return
        try:
            plots = self._shown_plots()
            now = time.monotonic()
            # one clock for all: every plot on screen shows the same newest step
            due = self.pacing.due(tuple(p.data_version() for p in plots), sum(p.build_s for p in plots), now)
            if any([plot.redraw(self.smoothing, self.logy, self.window, due=due) for plot in plots]):
                self.pacing.drawn(now)
        finally:
            self.watcher.lock.release()

    def _shown_plots(self) -> list[MetricPlot]:
        """The plots on screen: a hidden one (or one in a hidden tab) is not redrawn (nor waited for)."""
        return [p for p in self._plots if all(w.display for w in p.ancestors_with_self if hasattr(w, "display"))]

    def settled(self) -> bool:
        """Everything read so far is on screen (tests and benchmarks wait for this)."""
        return (self.loaded and self.watcher.history_ready and not self._dirty
                and all(p.drawn_current(self.window) for p in self._shown_plots())
                and self._logs.is_vertical_scroll_end and not self.watcher.log_switch_pending)

    @on(OptionList.OptionSelected)
    def _incident_selected(self) -> None:
        self._dirty = True

    # ------------------------------------------------------------------ view keys
    def action_toggle_throughput(self) -> None:
        lr, tps = self.query_one("#plot-lr", MetricPlot), self.query_one("#plot-tps", MetricPlot)
        lr.display, tps.display = tps.display, lr.display
        self.render_frame()

    def action_next_metric(self) -> None:
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

    def watch_smoothing(self) -> None:
        self.render_frame()

    def watch_logy(self) -> None:
        self.render_frame()

    def watch_window(self) -> None:
        self.render_frame()

    def action_next_window(self) -> None:
        self.window = next_window(self.window)

    def action_narrow(self) -> None:
        self.window = narrow(self.window)

    def action_widen(self) -> None:
        # the run's newest step as its span: the series belong to the worker while it reads
        self.window = widen(self.window, float(self.watcher.follower.state.step or 0))

    def action_next_rank(self) -> None:
        self._auto_rank_done = True  # the user picks the log from now on
        self.watcher.set_log_rank((self.watcher.log_rank + 1) % self.watcher.ranks())

    def action_focus_panel(self, n: int) -> None:
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

    def action_next_tab(self) -> None:
        """Tab: the next tab in a tabbed layout; elsewhere the next widget (a dialog on top has its own)."""
        tabs = self.tabs.next(self.layout_name)
        if tabs == self.tabs:
            self.focus_next()
            return
        n = tabs.active(self.layout_name)
        if n is not None:
            self.action_focus_panel(n)

    # ------------------------------------------------------------------ control keys
    def say(self, text: str, severity: str = "information", title: str = "") -> None:
        """Notify, and remember it (the help of a key that did nothing must be visible)."""
        text = safe_text(text, lines=True)   # control answers carry the run's own words
        self.said.append((severity, text))
        self.notify(text, severity=severity, title=title)  # type: ignore[arg-type]

    def _refused(self, action: str) -> bool:
        st = self.watcher.follower.state
        note: Note | None = refusal(action, st.state, st.supervisor_lost)
        if note is not None:
            self.say(note.text, note.severity)
        return note is not None

    def action_checkpoint(self) -> None:
        if not self._refused("checkpoint"):
            self._send("checkpoint", "checkpoint requested: rank 0 will save between steps")

    def action_stop(self) -> None:
        if not self._refused("stop"):
            self._send("stop", "stop requested: final checkpoint, then the run ends")

    def _send(self, action: str, text: str) -> None:
        from tui.supervise.control import NotReporting, request_stop, send_request  # import lazily
        try:
            rid = request_stop(self.run_dir) if action == "stop" else send_request(self.run_dir, action)
        except NotReporting as e:  # a script with no run.step: no one would read the request
            self.say(str(e), severity="warning")
            return
        except Exception as e:  # noqa: BLE001 - a failed request is said in the UI, never a crash
            self.say(f"could not send {action}: {e}", severity="error")
            return
        if rid is None:  # stop for a script that reports nothing through mt: its supervisor got SIGTERM
            self.say("stop: SIGTERM sent (the script reports nothing through mt: no final checkpoint)", title=action)
            return
        self.requests.add(rid, action)
        self.say(text, title=action)

    def action_kill(self) -> None:
        if self._refused("kill"):
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.say("killing the run: SIGUSR1 (no checkpoint), then SIGKILL after the grace period")
                self.post_message(ControlAsked("kill"))

        self.app.push_screen(ConfirmScreen(f"Kill run {safe_text(self.watcher.follower.state.name)}?\n"
                                           "SIGUSR1 to torchrun and every worker, SIGKILL after 10 s.\n"
                                           "No checkpoint is saved: progress since the last one is lost."), answered)

    def action_resume(self) -> None:
        if not self._refused("resume"):
            self.say("resuming from the newest checkpoint…")
            self.post_message(ControlAsked("resume"))

    def action_stacks(self) -> None:
        if not self._refused("stacks"):
            self.say("capturing every rank's stack…", title="stacks")
            self.post_message(ControlAsked("stacks"))

    @on(ControlDone)
    def _control_done(self, message: ControlDone) -> None:
        self.say(message.text, severity=message.severity)
        self.follow_failing_rank()
