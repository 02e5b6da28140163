"""The dashboard's stacks key and the hang incident's verdict, on a live run with a rank stuck
in the user's code (real `mt launch`, engine ranks, SIGUSR2), at 80x24."""
from __future__ import annotations

import pytest

from tests.cli.conftest import launch_user_run
from tests.tui.test_app import wait_for
from tui.supervise.control import kill_run
from tui.view.app import MtApp

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


async def test_p_captures_the_stacks_and_the_incident_panel_shows_the_hangs_verdict(tmp_path):
    run_dir = launch_user_run(tmp_path, 2, {"factory": "my_data:stuck", "args": {"rank": 1, "at": 20}, "num_workers": 0},
                              {"hang_floor_s": 4.0, "hang_step_factor": 2.0})
    app = MtApp(run_dir, poll_s=0.1, redraw_s=0.1)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            st = lambda: app.watcher.follower.state
            await wait_for(pilot, lambda: st().state == "running" and (st().step or 0) >= 2, 240)
            # p, once rank 1 is stuck (no new step for a second): a capture in a worker, the verdict as a notice
            seen = -1
            while st().step != seen:
                seen = st().step
                await pilot.pause(1.0)
            await pilot.press("p")
            assert ("information", "capturing every rank's stack…") in app.dashboard.said
            said = lambda: [t for _, t in app.dashboard.said if t.startswith("stacks: ")]
            await wait_for(pilot, lambda: said(), 30)
            assert said()[0].startswith("stacks: rank 1 is in `slow_item` (my_data.py:"), app.dashboard.said
            assert "rank 0 waits in `" in said()[0] and said()[0].endswith("Z-request)"), app.dashboard.said
            # the hang incident's capture: its verdict and rank 1's own frames head its detail
            hangs = lambda: [i for i in st().incidents if i.code == "hang" and "verdict" in i.evidence]
            await wait_for(pilot, hangs, 90)
            hang = lambda: hangs()[0]
            await pilot.press("3")
            await pilot.pause(0.3)
            detail = str(app.query_one("#incident-detail").content)
            lines = detail.splitlines()
            assert lines[1] == f"stacks: {hang().evidence['verdict']}", detail
            assert lines[2].startswith("  rank 1: slow_item (my_data.py:"), detail
            assert lines[3].lstrip().startswith("Stuck.__getitem__ (my_data.py:") or \
                lines[3].lstrip().startswith("__getitem__ (my_data.py:"), detail
            assert "groups:" not in detail and "frames:" not in detail   # shown as text, not as raw evidence
            assert app.query_one("#incident-detail").region.width >= 60   # readable at 80x24
    finally:
        kill_run(run_dir, grace_s=2.0)
