"""The dashboard's `b` (tui/view/rollbackkey.py): offered on a NaN or spike incident, it asks first,
then runs the same rollback as `mt rollback RUN`."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import events, mt, run_dir_from, status, wait_for, write_preset
from tests.tui.test_app import loaded, make_app, running_run
from tests.tui.test_app import wait_for as pilot_wait
from tui.widgets.dialogs import ConfirmScreen

pytestmark = pytest.mark.timeout(400)


async def test_b_without_a_nan_or_spike_says_how_to_roll_back_instead(tmp_path: Path) -> None:
    running_run(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await pilot.press("b")
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("this run has none" in t and "mt rollback" in t for _, t in app.dashboard.said)


@pytest.mark.slow
async def test_b_on_a_nan_asks_first_and_yes_rolls_back_before_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    preset = write_preset(tmp_path / "p.toml", runs, launch={"nproc_per_node": 1},
                          train={"max_steps": 12, "warmup_steps": 1, "on_nan": "skip"},
                          checkpoint={"every_steps": 4, "keep_last": 5}, faults={"nan_at_step": 6})
    run_dir = run_dir_from(mt("launch", preset, "--headless").stdout)
    assert status(run_dir)["state"] == "completed"
    app = make_app(run_dir)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await pilot.press("b")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmScreen) and not events(run_dir, "rollback")
        await pilot.press("b")
        await pilot.press("y")
        await pilot_wait(pilot, lambda: any("rollback 1 of this run" in t for _, t in app.dashboard.said), 120)
    [rb] = wait_for(lambda: events(run_dir, "rollback"), 120, "the rollback event")
    assert (rb["to_step"], rb["skip_batches"], rb["by"]) == (4, 2, "user") and "nan_loss at step 6" in rb["why"]
    wait_for(lambda: status(run_dir)["state"] == "completed", 180, "the rolled-back run to complete")


def test_the_incident_panel_offers_b_under_a_nan_or_spike_and_nowhere_else() -> None:
    from mt.contract.incident import IncidentLine
    from mt.rules import nan_incident
    from tui.widgets.incidents import incident_detail

    nan = nan_incident(7, 1e-3, float("nan"), float("nan"), [3, 9], "skip")
    shown = str(incident_detail(IncidentLine(**nan.fields())))
    assert "b: roll back past it: continue from the checkpoint before step 7" in shown
    other = IncidentLine("recompile", "warn", 7, "Recompiled at step 7", "", "advice", {})
    assert "roll back" not in str(incident_detail(other))
