"""The compare view (`mt watch RUN_A RUN_B ...`): a thin App that follows each run in its own worker
and shows them on the compare screen (tui/view/compare_screen.py), which owns layout and keys."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from textual import work
from textual.app import App
from textual.screen import Screen
from textual.worker import get_current_worker

from tui.format.fmt import safe_text
from tui.read.watcher import Watcher
from tui.view.compare_screen import CompareScreen, Polled


class CompareApp(App[int]):
    """Owns the lifecycle: one Watcher and one follow worker per run directory, and the exit."""

    CSS_PATH = ["mt.tcss", "compare.tcss"]   # the dashboard's plot and help styles, then this view's
    TITLE = "mt watch (compare)"

    def __init__(self, run_dirs: list[Path], clock: Callable[[], float] = time.time,
                 poll_s: float = 0.5, redraw_s: float = 0.5) -> None:
        super().__init__()
        self.run_dirs = [Path(d) for d in run_dirs]
        names = [d.name for d in self.run_dirs]
        # two runs of one name (runs/a/x, runs/b/x) are told apart by their paths
        self.names = [safe_text(n) for n in (names if len(set(names)) == len(names) else map(str, self.run_dirs))]
        self.clock, self.poll_s = clock, poll_s
        self.watchers = [Watcher(d) for d in self.run_dirs]
        self.compare = CompareScreen(self.names, self.watchers, redraw_s, mounted=self._follow_all)

    def get_default_screen(self) -> Screen:
        return self.compare

    def _follow_all(self) -> None:
        for i in range(len(self.watchers)):
            self.follow(i)

    @property
    def loaded(self) -> bool:
        """Every run's first poll is on screen."""
        return self.compare.loaded

    def settled(self) -> bool:
        """Everything read so far is on screen (tests and benchmarks wait for this)."""
        return self.compare.settled()

    @work(thread=True, group="follow", name="follow run")
    def follow(self, index: int) -> None:
        """Poll run `index` for new bytes; tell the screen when something changed."""
        worker, watcher = get_current_worker(), self.watchers[index]
        tell = lambda: self.compare.post_message(Polled(index))
        first = True
        while not worker.is_cancelled:
            update = watcher.poll(on_quick=tell)
            if update.run.changed or update.system_changed or first:
                tell()
                first = False
            worker.cancelled_event.wait(self.poll_s)


def run_compare(run_dirs: list[Path]) -> int:
    """Open the compare view until the user quits; the runs themselves keep going."""
    app = CompareApp(run_dirs)
    app.run()
    return app.return_code or 0  # 1 when the app died of an error (Textual printed it)
