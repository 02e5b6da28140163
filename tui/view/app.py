"""The live dashboard (`mt watch RUN_DIR`): a thin App that follows the run in a worker, runs the
control workers the dashboard screen asks for (tui/view/dashboard.py), routes their messages, and exits."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from textual import on, work
from textual.app import App
from textual.screen import Screen
from textual.worker import get_current_worker

from mt.contract import door
from mt.contract.status import read_status
from tui.format.fmt import safe_text
from tui.read.follower import PollResult
from tui.read.rundir import liveness
from tui.read.watcher import Watcher, WatchUpdate
from tui.view.dashboard import DashboardScreen
from tui.view.messages import ControlAsked, ControlDone, RunUpdated

INLINE_READ_BYTES = 1 << 20  # run files this small are read before the first paint (< 0.1 s)


class MtApp(App[int]):
    """Owns the lifecycle: the follow worker, the control workers, the exit; the screen owns the rest."""

    CSS_PATH = "mt.tcss"
    TITLE = "mt watch"

    def __init__(self, run_dir: Path, clock: Callable[[], float] = time.time,
                 poll_s: float = 0.25, redraw_s: float = 0.5) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.poll_s = poll_s
        self.watcher = Watcher(self.run_dir)
        self.dashboard = DashboardScreen(self.run_dir, self.watcher, clock, redraw_s, mounted=self._dashboard_mounted)

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
        paths = self.watcher.paths
        return sum(door.size_of(p) for p in (paths.events, paths.system, paths.incidents)) < INLINE_READ_BYTES

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
        self.dashboard.show_update(u)

    # ------------------------------------------------------------------ control workers
    @on(ControlAsked)
    def _control_asked(self, message: ControlAsked) -> None:
        """The screen allowed it (tui/state/requests.py); its answer goes back to the screen."""
        {"kill": self._kill, "resume": self._resume, "stacks": self._stacks, "rollback": self._rollback}[message.action]()

    def _answer(self, text: str, severity: str = "information") -> None:
        self.dashboard.post_message(ControlDone(text, severity))

    @work(thread=True, group="control", name="kill run")
    def _kill(self) -> None:
        try:
            from tui.supervise.control import kill_run
            result = kill_run(self.run_dir, grace_s=10.0)
            left = getattr(result, "survivors", None)
            self._answer(*((f"kill left processes running: {left}", "error") if left else ("run killed",)))
        except Exception as e:  # noqa: BLE001 - a failed kill is said in the UI, never a crash
            self._answer(f"kill failed: {e}", "error")

    @work(thread=True, group="control", name="resume run")
    def _resume(self) -> None:
        try:
            from tui.supervise.launch import resume_run
            resume_run(self.run_dir)
            self._answer("resumed: following the new attempt")
        except Exception as e:  # noqa: BLE001 - a failed resume is said in the UI, never a crash
            self._answer(f"cannot resume: {e}", "error")

    @work(thread=True, group="control", name="roll back run")
    def _rollback(self) -> None:
        try:   # the same rollback as `mt rollback RUN` (its defaults: before the newest NaN or spike)
            from tui.supervise.rollback import plan, roll_back
            self._answer(roll_back(self.run_dir, plan(self.run_dir, None, None, None)))
        except Exception as e:  # noqa: BLE001 - a failed rollback is said in the UI, never a crash
            self._answer(f"cannot roll back: {e}", "error")

    @work(thread=True, exclusive=True, group="stacks", name="capture stacks")
    def _stacks(self) -> None:
        try:
            from tui.stacks.nodes import capture_everywhere
            from tui.stacks.text import verdict_note
            self._answer(verdict_note(capture_everywhere(self.run_dir)))
        except Exception as e:  # noqa: BLE001 - a failed capture is said in the UI, never a crash
            self._answer(f"no stacks: {e}", "error")


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
