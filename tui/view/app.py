"""The live dashboard (`mt watch RUN_DIR`): a thin App that follows the run, shows it on the
dashboard screen (tui/view/dashboard.py) and sends the run's control requests."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from textual import on, work
from textual.app import App
from textual.screen import Screen
from textual.worker import get_current_worker

from mt.contract.records import Checkpoint, ControlEvent, Record
from mt.contract.status import FINAL_STATES, read_status
from tui.format.fmt import safe_text
from tui.read.follower import PollResult
from tui.read.rundir import liveness
from tui.read.watcher import Watcher, WatchUpdate
from tui.view.dashboard import DashboardScreen
from tui.view.messages import ControlDone, RunUpdated
from tui.widgets.dialogs import ConfirmScreen

RESUMABLE = ("stopped", "failed", "killed")
INLINE_READ_BYTES = 1 << 20  # run files this small are read before the first paint (< 0.1 s)


class MtApp(App[int]):
    """Follows one run directory and sends it control requests (the screen's keys c, s, k, r)."""

    CSS_PATH = "mt.tcss"
    TITLE = "mt watch"

    def __init__(self, run_dir: Path, clock: Callable[[], float] = time.time,
                 poll_s: float = 0.25, redraw_s: float = 0.5) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.poll_s = poll_s
        self.watcher = Watcher(self.run_dir)
        self.pending: dict[str, str] = {}     # request id -> action, until the engine answers
        self.sent: list[tuple[str, str]] = []  # (request id, action) of every request, oldest first
        self.said: list[tuple[str, str]] = []  # (severity, text) of every notification, oldest first
        self.dashboard = DashboardScreen(self.run_dir.name, self.watcher, clock, redraw_s,
                                         say=self.say, mounted=self._dashboard_mounted)

    def get_default_screen(self) -> Screen:
        return self.dashboard

    @property
    def loaded(self) -> bool:
        """The first poll is on screen."""
        return self.dashboard.loaded

    def settled(self) -> bool:
        """Everything read so far is on screen (tests and benchmarks wait for this)."""
        return self.dashboard.settled()

    def _dashboard_mounted(self) -> None:
        if self._quick_to_read():
            # A small run is read before the first paint, so the first frame shows it; painting
            # an empty dashboard first would cost a second full layout. The worker reads the rest.
            self._show_update(self.watcher.poll())
        elif self.watcher.open_quick():
            # a big run with the engine's index: its newest state costs a few ms, so the first
            # frame shows it too; the worker reads the whole history next
            self._show_update(WatchUpdate(run=PollResult(changed=True)))
        self.follow()

    def _quick_to_read(self) -> bool:
        """The run's files are small enough to read before the first paint."""
        total = 0
        for path in (self.watcher.paths.events, self.watcher.paths.system, self.watcher.paths.incidents):
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total < INLINE_READ_BYTES

    # ------------------------------------------------------------------ following
    @work(thread=True, exclusive=True, group="follow", name="follow run")
    def follow(self) -> None:
        """Poll the run directory for new bytes and hand them to the UI as messages."""
        worker = get_current_worker()
        quick = lambda: self.post_message(RunUpdated(WatchUpdate(run=PollResult(changed=True))))
        while not worker.is_cancelled:
            update = self.watcher.poll(on_quick=quick)
            if (update.run.changed or update.system_changed or update.new_log_lines
                    or update.log_reset or update.log_pending is not None or not self.loaded):
                self.post_message(RunUpdated(update))
            worker.cancelled_event.wait(self.poll_s)

    @on(RunUpdated)
    def _run_updated(self, message: RunUpdated) -> None:
        self._show_update(message.update)

    def _show_update(self, u: WatchUpdate) -> None:
        for ev in u.run.new_events:
            self._maybe_notify(ev)
        self.dashboard.show_update(u)

    def _maybe_notify(self, ev: Record) -> None:
        """Tell the user what the engine answered to a request this viewer sent."""
        asked = [rid for rid in ev.request_ids if rid in self.pending] if isinstance(ev, Checkpoint) else []
        if asked:
            # its `control done` may come before or after it: this is the answer that counts
            self.say(f"checkpoint saved at step {ev.step}", title="checkpoint")
            for rid in asked:
                self.pending.pop(rid, None)
        elif isinstance(ev, ControlEvent) and ev.request_id in self.pending:
            if ev.status == "rejected":
                self.say(f"{ev.action} rejected: {ev.detail}", severity="error")
                self.pending.pop(ev.request_id, None)
            elif ev.status == "accepted" and ev.action == "stop":
                self.say("stop accepted: final checkpoint, then the ranks exit")
            elif ev.status == "done" and ev.action != "checkpoint":
                self.pending.pop(ev.request_id, None)

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
        if st in FINAL_STATES:
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
        self.pending[rid] = action
        self.sent.append((rid, action))
        self.say(text, title=action)

    def action_kill(self) -> None:
        if self._refuse_final("kill"):
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.say("killing the run: SIGUSR1 (no checkpoint), then SIGKILL after the grace period")
                self._kill()

        self.push_screen(ConfirmScreen(f"Kill run {safe_text(self.watcher.follower.state.name)}?\n"
                                       "SIGUSR1 to torchrun and every worker, SIGKILL after 10 s.\n"
                                       "No checkpoint is saved: progress since the last one is lost."), answered)

    @work(thread=True, group="control", name="kill run")
    def _kill(self) -> None:
        try:
            from tui.supervise.control import kill_run
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
            from tui.supervise.launch import resume_run
            resume_run(self.run_dir)
            self.post_message(ControlDone("resumed: following the new attempt"))
        except Exception as e:  # noqa: BLE001 - a failed resume is said in the UI, never a crash
            self.post_message(ControlDone(f"cannot resume: {e}", "error"))

    def action_stacks(self) -> None:
        if self._state() in FINAL_STATES:
            self.say(f"the run is {self._state()}: no rank to capture", severity="warning")
            return
        self.say("capturing every rank's stack…", title="stacks")
        self._stacks()

    @work(thread=True, exclusive=True, group="stacks", name="capture stacks")
    def _stacks(self) -> None:
        try:
            from tui.stacks.nodes import capture_everywhere
            from tui.stacks.text import verdict_note
            self.post_message(ControlDone(verdict_note(capture_everywhere(self.run_dir))))
        except Exception as e:  # noqa: BLE001 - a failed capture is said in the UI, never a crash
            self.post_message(ControlDone(f"no stacks: {e}", "error"))

    @on(ControlDone)
    def _control_done(self, message: ControlDone) -> None:
        self.say(message.text, severity=message.severity)
        self.dashboard.follow_failing_rank()


def run_app(run_dir: Path) -> int:
    """Open the dashboard on RUN_DIR until the user quits; the run itself keeps going."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        print(f"mt watch: {run_dir}: no such run directory", file=sys.stderr)
        return 2
    app = MtApp(run_dir)
    app.run()
    if liveness(read_status(run_dir)) in ("pending", "starting", "live"):  # the viewer quit, the run did not
        shown = safe_text(run_dir)
        print(f"run dir: {shown}\nthe run goes on; re-attach with: mt watch {shown}")
    return app.return_code or 0  # 1 when the app died of an error (Textual printed it)
