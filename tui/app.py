"""The live dashboard (`mt watch RUN_DIR`): a thin App that wires the follower to the widgets."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.reactive import reactive
from textual.widgets import Footer, OptionList, Static
from textual.worker import get_current_worker

from mt.events import FINAL_STATES
from mt.records import Checkpoint, Control, Record
from tui.app_view import ViewKeys
from tui.format import safe_text
from tui.messages import ControlDone, RunUpdated
from tui.plotkeys import HELP_BINDING, SMOOTHING_BINDINGS, PlotKeys
from tui.read.follower import PollResult
from tui.read.watcher import Watcher, WatchUpdate
from tui.rundir import liveness, read_status
from tui.state.layout import Tabs
from tui.state.pacing import Pacing
from tui.state.window import XWindow
from tui.widgets.dialogs import ConfirmScreen
from tui.widgets.header import RunHeader
from tui.widgets.incidents import IncidentsPanel
from tui.widgets.logs import LogsPanel
from tui.widgets.notice import Notice, notice_text
from tui.widgets.plots import Curve, MetricPlot
from tui.widgets.system import SystemPanel
from tui.widgets.tabstrip import TabStrip

RESUMABLE = ("stopped", "failed", "killed")
INLINE_READ_BYTES = 1 << 20  # run files this small are read before the first paint (< 0.1 s)
LOCK_WAIT_S = 0.05           # a poll holds the watcher's lock for ms; a bulk load reads without it


class MtApp(ViewKeys, PlotKeys, App[int]):
    """Follows one run directory; keys send control requests to the run."""

    CSS_PATH = "mt.tcss"
    TITLE = "mt watch"
    BINDINGS = [
        Binding("c", "checkpoint", "Checkpoint", id="checkpoint", tooltip="Save a checkpoint now"),
        Binding("s", "stop", "Stop", id="stop", tooltip="Graceful stop with a final checkpoint"),
        Binding("k", "kill", "Kill", id="kill", tooltip="Terminate every process of the run (asks first)"),
        Binding("r", "resume", "Resume", id="resume", tooltip="New attempt from the newest checkpoint"),
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
        Binding("1", "focus_panel(1)", "Plots", show=False, id="focus-1",
                tooltip="Focus the plots (in a small terminal: show the loss plot)"),
        Binding("2", "focus_panel(2)", "System", show=False, id="focus-2",
                tooltip="Focus the system panel (in a small terminal: show it)"),
        Binding("3", "focus_panel(3)", "Incidents", show=False, id="focus-3",
                tooltip="Focus the incidents (up/down selects one, its detail below)"),
        Binding("4", "focus_panel(4)", "Logs", show=False, id="focus-4", tooltip="Focus the logs"),
        Binding("5", "focus_panel(5)", "Small plots", show=False, id="focus-5",
                tooltip="The lr / tokens/s / metric and grad-norm plots (a tab of their own at 80×24)"),
        Binding("tab", "next_tab", "Next tab", show=False, id="next-tab", priority=True, key_display="Tab",
                tooltip="Next tab where panels are tabs (small terminals); next widget elsewhere"),
        HELP_BINDING,
        Binding("q", "quit", "Quit", id="quit", tooltip="Close the viewer; the run keeps going"),
    ]

    smoothing: reactive[float] = reactive(0.6)
    logy: reactive[bool] = reactive(False)
    window: reactive[XWindow] = reactive(XWindow)

    def __init__(self, run_dir: Path, clock: Callable[[], float] = time.time,
                 poll_s: float = 0.25, redraw_s: float = 0.5) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.clock = clock
        self.poll_s, self.redraw_s = poll_s, redraw_s
        self.watcher = Watcher(self.run_dir)
        self.pending: dict[str, str] = {}     # request id -> action, until the engine answers
        self.sent: list[tuple[str, str]] = []  # (request id, action) of every request, oldest first
        self.loaded = False                   # first poll done (tests wait on it)
        self._dirty = True
        self._auto_rank_done = False
        self.said: list[tuple[str, str]] = []  # (severity, text) of every notification, oldest first
        self.layout_name = "full"
        self.tabs = Tabs()
        self.pacing = Pacing()                # when the plots redraw for new points

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        series = self.watcher.follower.series
        st = self.watcher.follower.state
        yield RunHeader(f"{safe_text(self.run_dir.name)}  reading the run…", id="header")
        yield Notice(id="notice")
        yield TabStrip("", id="tabstrip")
        with Horizontal(id="main"):
            with Vertical(id="plots"):
                yield MetricPlot("loss: train (cyan, raw grey), val (orange)", "loss", [
                    Curve("train", series.loss, "cyan"),
                    Curve("val", series.val_loss, "orange", smooth=False)], id="plot-loss")
                with Horizontal(id="plots-small"):
                    yield MetricPlot("learning rate", "lr", [Curve("lr", series.lr, "green", smooth=False)],
                                     id="plot-lr")
                    yield MetricPlot("tokens/s", "tokens/s", [Curve("tokens/s", series.tokens_per_s, "yellow")],
                                     id="plot-tps")
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
        # kept so redraws work while a modal screen (help, confirm) is on top
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
        self._main_screen = self.screen
        self.query_one("#system").border_title = "2 system"
        self.query_one("#incidents").border_title = "3 incidents"
        self.query_one("#plots").border_title = "1 plots"
        self.query_one("#logs").border_title = "4 logs: rank0.log  (g: next rank)"
        self._apply_size(self.size.width, self.size.height)
        if self._quick_to_read():
            # A small run is read before the first paint, so the first frame shows it; painting
            # an empty dashboard first would cost a second full layout. The worker reads the rest.
            self._show_update(self.watcher.poll())
        elif self.watcher.open_quick():
            # a big run with the engine's index: its newest state costs a few ms, so the first
            # frame shows it too; the worker reads the whole history next
            self._show_update(WatchUpdate(run=PollResult(changed=True)))
        self.follow()
        self.set_interval(self.redraw_s, self.render_frame)

    def _quick_to_read(self) -> bool:
        """The run's files are small enough to read before the first paint."""
        total = 0
        for path in (self.watcher.paths.events, self.watcher.paths.system, self.watcher.paths.incidents):
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total < INLINE_READ_BYTES

    def on_resize(self, event: Resize) -> None:
        if hasattr(self, "_main_screen"):
            self._apply_size(event.size.width, event.size.height)
            # the header's bar and the plots fit the new size once it is laid out, not a tick later
            self.call_after_refresh(self.render_frame)

    # ------------------------------------------------------------------ following
    @work(thread=True, exclusive=True, group="follow", name="follow run")
    def follow(self) -> None:
        """Poll the run directory for new bytes and hand them to the UI as messages."""
        worker = get_current_worker()
        quick = lambda: self.post_message(RunUpdated(WatchUpdate(run=PollResult(changed=True))))
        while not worker.is_cancelled:
            update = self.watcher.poll(on_quick=quick)
            if (update.run.changed or update.system_changed or update.new_log_lines
                    or update.log_reset or not self.loaded):
                self.post_message(RunUpdated(update))
            worker.cancelled_event.wait(self.poll_s)

    @on(RunUpdated)
    def _run_updated(self, message: RunUpdated) -> None:
        self._show_update(message.update)

    def _show_update(self, u: WatchUpdate) -> None:
        first = not self.loaded
        self.loaded = True
        self._dirty = True
        if first:  # draw now rather than at the next tick, and tell the worker it is shown
            self.render_frame()
            self.call_after_refresh(self.watcher.frame_shown.set)
        self._logs.show(self.watcher.log_rank, u.new_log_lines, u.log_reset)
        for ev in u.run.new_events:
            self._maybe_notify(ev)
        st = self.watcher.follower.state
        if st.state in ("failed", "killed") and not self._auto_rank_done:
            # show the failing rank's log without being asked; until the rules' exit incident
            # names it (it may come after the state), the reason's rank may only have lost its peer
            self._auto_rank_done = st.exit_incident() is not None
            rank = st.failing_rank()
            if rank is not None and rank != self.watcher.log_rank:
                self.watcher.set_log_rank(rank)

    def _maybe_notify(self, ev: Record) -> None:
        """Tell the user what the engine answered to a request this viewer sent."""
        asked = [rid for rid in ev.request_ids if rid in self.pending] if isinstance(ev, Checkpoint) else []
        if asked:
            # its `control done` may come before or after it: this is the answer that counts
            self.say(f"checkpoint saved at step {ev.step}", title="checkpoint")
            for rid in asked:
                self.pending.pop(rid, None)
        elif isinstance(ev, Control) and ev.request_id in self.pending:
            if ev.status == "rejected":
                self.say(f"{ev.action} rejected: {ev.detail}", severity="error")
                self.pending.pop(ev.request_id, None)
            elif ev.status == "accepted" and ev.action == "stop":
                self.say("stop accepted: final checkpoint, then the ranks exit")
            elif ev.status == "done" and ev.action != "checkpoint":
                self.pending.pop(ev.request_id, None)

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
            self._main_screen.set_class(self._notice.display, "notice-shown")
            self._grad.hline = st.grad_clip
            # plots after this refresh: a first frame of a huge run shows the header at once
            self.call_after_refresh(self._redraw_plots)
            if self._dirty:
                ended = st.state if st.state in FINAL_STATES else "lost" if st.supervisor_lost else None
                self._system.show(self.watcher.system, ended, now, sampled=st.status.get("owner") != "script")
                self._incidents.show(st.incidents, now)
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

    def settled(self) -> bool:
        """Everything read so far is on screen (tests and benchmarks wait for this)."""
        return (self.loaded and self.watcher.history_ready and not self._dirty
                and all(p.drawn_current(self.window) for p in self._shown_plots())
                and self._logs.is_vertical_scroll_end and not self.watcher.log_switch_pending)

    # ------------------------------------------------------------------ actions
    def say(self, text: str, severity: str = "information", title: str = "") -> None:
        """Notify, and remember it (the help of a key that did nothing must be visible)."""
        text = safe_text(text, lines=True)   # control answers carry the run's own words
        self.said.append((severity, text))
        self.notify(text, severity=severity, title=title)  # type: ignore[arg-type]

    def _state(self) -> str:
        return self.watcher.follower.state.state

    def _refuse_final(self, what: str) -> bool:
        st = self._state()
        if st in ("completed", "stopped", "failed", "killed"):
            self.say(f"the run is {st}: nothing to {what}", severity="warning")
            return True
        if st == "stopping" and what != "kill":
            self.say(f"the run is already stopping: cannot {what}", severity="warning")
            return True
        return False

    def action_checkpoint(self) -> None:
        if self._refuse_final("checkpoint"):
            return
        self._send("checkpoint", "checkpoint requested: rank 0 will save between steps")

    def action_stop(self) -> None:
        if self._refuse_final("stop"):
            return
        self._send("stop", "stop requested: final checkpoint, then the run ends")

    def _send(self, action: str, text: str) -> None:
        from tui.run.control import NotReporting, request_stop, send_request  # import lazily
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
        self.pending[rid] = action
        self.sent.append((rid, action))
        self.say(text, title=action)

    def action_kill(self) -> None:
        if self._refuse_final("kill"):
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.say("killing the run: SIGTERM, then SIGKILL after the grace period")
                self._kill()

        self.push_screen(ConfirmScreen(f"Kill run {safe_text(self.watcher.follower.state.name)}?\n"
                                       "SIGTERM to torchrun and every worker, SIGKILL after 10 s.\n"
                                       "Unsaved progress since the last checkpoint is lost."), answered)

    @work(thread=True, group="control", name="kill run")
    def _kill(self) -> None:
        try:
            from tui.run.control import kill_run
            result = kill_run(self.run_dir, grace_s=10.0)
            left = getattr(result, "survivors", None)
            self.post_message(ControlDone(f"kill left processes running: {left}", "error") if left
                              else ControlDone("run killed"))
        except Exception as e:  # noqa: BLE001 - a failed kill is said in the UI, never a crash
            self.post_message(ControlDone(f"kill failed: {e}", "error"))

    def action_resume(self) -> None:
        st = self._state()
        if st not in RESUMABLE and not self.watcher.follower.state.supervisor_lost:
            self.say(f"the run is {st}: only a stopped, failed or killed run can be resumed",
                        severity="warning")
            return
        self.say("resuming from the newest checkpoint…")
        self._resume()

    @work(thread=True, group="control", name="resume run")
    def _resume(self) -> None:
        try:
            from tui.run.launch import resume_run
            resume_run(self.run_dir)
            self.post_message(ControlDone("resumed: following the new attempt"))
        except Exception as e:  # noqa: BLE001 - a failed resume is said in the UI, never a crash
            self.post_message(ControlDone(f"cannot resume: {e}", "error"))

    @on(ControlDone)
    def _control_done(self, message: ControlDone) -> None:
        self.say(message.text, severity=message.severity)
        self._auto_rank_done = False

    def action_next_rank(self) -> None:
        self._auto_rank_done = True  # the user picks the log from now on
        self.watcher.set_log_rank((self.watcher.log_rank + 1) % self.watcher.ranks())


    @on(OptionList.OptionSelected)
    def _incident_selected(self) -> None:
        self._dirty = True


def run_app(run_dir: Path) -> int:
    """Open the dashboard on RUN_DIR until the user quits; the run itself keeps going."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        print(f"mt watch: {run_dir}: no such run directory", file=sys.stderr)
        return 2
    app = MtApp(run_dir)
    app.run()
    if liveness(read_status(run_dir)) in ("starting", "live"):  # the viewer quit, the run did not
        shown = safe_text(run_dir)
        print(f"run dir: {shown}\nthe run goes on; re-attach with: mt watch {shown}")
    return app.return_code or 0  # 1 when the app died of an error (Textual printed it)
