"""Screenshots of the main screen for recorded runs, at a fixed size and a fixed clock."""
from __future__ import annotations

import pytest

from tests.tui.conftest import FIXTURES, fixed_now
from tui.view.app import MtApp

pytestmark = pytest.mark.timeout(120)
SIZE = (140, 44)


def app_for(name: str) -> MtApp:
    # the fixture directory is only read, so it can be used in place
    run = FIXTURES / name
    now = fixed_now(run)
    return MtApp(run, clock=lambda: now, poll_s=0.05, redraw_s=0.05)


async def settle(pilot) -> None:
    """Wait until the screen shows everything read, twice in a row (layout may still move)."""
    streak = 0
    for _ in range(400):
        streak = streak + 1 if pilot.app.settled() else 0
        if streak >= 4:
            return
        await pilot.pause(0.05)
    raise AssertionError("the dashboard never settled")


def test_snapshot_finished_run(snap_compare):
    assert snap_compare(app_for("finished"), terminal_size=SIZE, run_before=settle)


def test_snapshot_run_with_incidents(snap_compare):
    assert snap_compare(app_for("incidents"), terminal_size=SIZE, run_before=settle)


def test_snapshot_cpu_only_run(snap_compare):
    assert snap_compare(app_for("cpu_only"), terminal_size=SIZE, run_before=settle)


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_finished_run_at_terminal_size(snap_compare, size):
    """The layouts of tui/state/layout.py: the loss plot and tabs, the plots beside one panel, all."""
    assert snap_compare(app_for("finished"), terminal_size=size, run_before=settle)
