"""The screens own their layout and keys: each works inside a bare Textual App that has none of
mt's Apps' actions (the Apps only follow the runs, run workers and exit)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from textual.app import App
from textual.screen import Screen

from tests.tui.conftest import FIXTURES
from tests.tui.test_app import wait_for
from tui.read.watcher import Watcher

pytestmark = pytest.mark.timeout(120)
VIEW = Path(__file__).parents[2] / "tui" / "view"


class Bare(App[None]):
    """Shows one screen; no bindings or actions of its own beyond Textual's."""

    def __init__(self, screen: Screen, css: list[Path]) -> None:
        self.CSS_PATH = css
        super().__init__()
        self._screen = screen

    def get_default_screen(self) -> Screen:
        return self._screen


async def test_the_dashboard_screen_owns_the_control_keys_and_their_policy(tmp_path: Path) -> None:
    from tui.view.dashboard import DashboardScreen
    run = tmp_path / "done-run"
    shutil.copytree(FIXTURES / "finished", run)
    watcher = Watcher(run)
    screen = DashboardScreen(run, watcher, time.time, 0.05, mounted=lambda: screen.show_update(watcher.poll()))
    app = Bare(screen, [VIEW / "mt.tcss"])
    async with app.run_test(size=(140, 44)) as pilot:
        await wait_for(pilot, lambda: screen.loaded)
        for key, said in (("c", "the run is completed: nothing to checkpoint"),
                          ("s", "the run is completed: nothing to stop"),
                          ("k", "the run is completed: nothing to kill"),
                          ("p", "the run is completed: no rank to capture")):
            await pilot.press(key)
            await wait_for(pilot, lambda: bool(screen.said) and screen.said[-1] == ("warning", said))
        assert screen.requests.sent == [] and not (run / "control").exists()   # nothing was sent
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)


async def test_the_compare_screen_owns_its_keys(tmp_path: Path) -> None:
    from tui.view.compare_screen import CompareScreen, Polled
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        shutil.copytree(FIXTURES / "finished", run)
    watchers = [Watcher(run) for run in runs]

    def polled() -> None:  # what the App's workers do, once
        for i, w in enumerate(watchers):
            w.poll()
            screen.post_message(Polled(i))

    screen = CompareScreen(["a", "b"], watchers, 0.05, mounted=polled)
    app = Bare(screen, [VIEW / "mt.tcss", VIEW / "compare.tcss"])
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: screen.loaded)
        plot = screen.query_one("#compare-loss")
        assert plot.title.startswith("loss vs step"), plot.title
        await pilot.press("x")
        await wait_for(pilot, lambda: screen.x_mode == "tokens" and plot.title.startswith("loss vs tokens seen"))
        smoothing = screen.smoothing
        await pilot.press("l")   # log-y, one of the plot keys the screen shares with the dashboard
        await wait_for(pilot, lambda: screen.logy)
        assert screen.smoothing == smoothing
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)
