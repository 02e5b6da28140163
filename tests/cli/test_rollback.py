"""`mt rollback`: checked before anything is touched, then a stopped or live run continues from an
earlier checkpoint with batches skipped and its learning rate scaled (docs/cli.md#mt-rollback)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import events, incidents, mt, run_dir_from, status, wait_for, write_preset


def _snapshot(run_dir: Path) -> tuple:
    """What a refused rollback must leave as it was: the checkpoints, events, status, no request."""
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    return ckpts, (run_dir / "events.jsonl").stat().st_size, status(run_dir)["state"], (run_dir / "rollback.json").exists()


@pytest.mark.slow
def test_rollback_of_a_finished_run_skips_batches_and_scales_the_lr(tmp_path: Path, runs: Path) -> None:
    preset = write_preset(tmp_path / "p.toml", runs, launch={"nproc_per_node": 1},
                          train={"max_steps": 16, "warmup_steps": 1}, checkpoint={"every_steps": 4, "keep_last": 5})
    first = mt("launch", preset, "--headless")
    run_dir = run_dir_from(first.stdout)
    assert status(run_dir)["state"] == "completed", first.stdout + first.stderr
    before = _snapshot(run_dir)
    # bad input: one line, exit 2, nothing changed
    for args, says in ((["--to", "3"], "no intact checkpoint at or before step 3"), (["--lr-scale", "0"], "--lr-scale"),
                       (["--lr-scale", "nan"], "--lr-scale"), (["--skip-batches", "-1"], "--skip-batches")):
        res = mt("rollback", run_dir, *args, "--detach")
        assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, (args, res.stderr)
        assert _snapshot(run_dir) == before, args

    old = {e["step"]: e for e in events(run_dir, "step")}
    res = mt("rollback", run_dir, "--to", "10", "--skip-batches", "3", "--lr-scale", "0.5", "--headless")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rolling back to the checkpoint of step 8" in res.stdout
    [rb] = events(run_dir, "rollback")
    assert (rb["step"], rb["to_step"], rb["skip_batches"], rb["lr_scale"], rb["by"], rb["count"]) == (16, 8, 3, 0.5, "user", 1)
    [knob] = events(run_dir, "knob")  # the lr knob it turned, as any turned knob: marked, shown in the header
    assert (knob["step"], knob["key"], knob["value"], knob["previous"], knob["by"]) == (9, "lr_scale", 0.5, 1.0, "rollback")
    new = [e for e in events(run_dir, "step") if e["t"] > rb["t"]]
    assert [e["step"] for e in new] == list(range(9, 17))
    batch = old[1]["samples_seen"]
    assert new[0]["samples_seen"] == (8 + 3 + 1) * batch  # 3 global batches skipped, the order otherwise kept
    assert all(e["lr"] == pytest.approx(0.5 * old[e["step"]]["lr"], rel=1e-12) for e in new)
    assert sorted(p.name for p in (run_dir / "checkpoints" / "abandoned").iterdir()) == ["1-step-12", "1-step-16"]
    assert status(run_dir)["state"] == "completed" and not (run_dir / "rollback.json").exists()  # spent: removed
    _viewers_show_the_rollback(run_dir, runs, {e["step"]: e["loss"] for e in new})


def _viewers_show_the_rollback(run_dir: Path, runs: Path, kept: dict[int, float]) -> None:
    """The abandoned steps 9..16 are not the run's in the plots (live follow and a big run's bulk
    read alike), a red mark stands at step 8, and mt ls / --once say the run was rolled back."""
    from tui.read.follower import RunFollower
    from tui.state.runseries import MARK_KNOB, MARK_ROLLBACK

    follower = RunFollower(run_dir)
    follower.poll()
    for series in (follower.series, follower.bulk().series):
        x, y = series.loss.arrays()
        assert x.tolist() == list(range(1, 17))
        assert {int(s): v for s, v in zip(x.tolist(), y.tolist()) if s > 8} == kept
        # the rollback at step 8, the lr knob it turned from step 9
        assert [a.tolist() for a in series.marks.arrays()] == [[8.0, 9.0], [MARK_ROLLBACK, MARK_KNOB]]
    assert follower.state.rollbacks == 1
    once = mt("watch", run_dir, "--once")
    assert "rolled back from step 16 to step 8 (to step 10 (mt rollback --to); by user): 3 batches skipped, lr x0.5" in once.stdout
    assert "completed, rolled back 1x" in mt("ls", runs).stdout


@pytest.mark.slow
def test_rollback_of_a_live_run_stops_it_and_goes_back_before_its_nan(tmp_path: Path, runs: Path) -> None:
    preset = write_preset(tmp_path / "p.toml", runs, launch={"nproc_per_node": 1},
                          train={"max_steps": 40, "warmup_steps": 1, "on_nan": "skip"},
                          checkpoint={"every_steps": 4, "keep_last": 5}, faults={"nan_at_step": 6, "step_sleep_s": 0.3})
    run_dir = run_dir_from(mt("launch", preset, "--detach").stdout)
    wait_for(lambda: any(e["step"] >= 10 for e in events(run_dir, "step")), 180, "step 10")
    res = mt("rollback", run_dir, "--headless", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    [rb] = events(run_dir, "rollback")
    # the default: the newest checkpoint before the NaN (step 4), every batch through it skipped (5 and 6)
    assert (rb["to_step"], rb["skip_batches"], rb["by"]) == (4, 2, "user") and "nan_loss at step 6" in rb["why"]
    assert any(e["reason"] == "stop" for e in events(run_dir, "checkpoint"))  # the live run stopped first
    assert "1-step-8" in {p.name for p in (run_dir / "checkpoints" / "abandoned").iterdir()}
    assert status(run_dir)["state"] == "completed"


@pytest.mark.slow
def test_on_nan_rollback_under_the_supervisor_starts_the_next_attempt_without_spending_a_restart(tmp_path: Path, runs: Path) -> None:
    preset = write_preset(tmp_path / "p.toml", runs, launch={"nproc_per_node": 1, "max_restarts": 0},
                          train={"max_steps": 12, "warmup_steps": 1, "on_nan": "rollback"},
                          checkpoint={"every_steps": 4}, faults={"nan_at_step": 6})
    res = mt("launch", preset, "--headless")
    run_dir = run_dir_from(res.stdout)
    st = status(run_dir)
    assert res.returncode == 0 and st["state"] == "completed" and st["attempt"] == 2, res.stdout + res.stderr
    assert "run ended at step 5: rolled_back (rolling back to step 4 after a non-finite loss at step 6)" in res.stdout
    assert "rolled back from step 6 to step 4 (non-finite loss; by on_nan): 2 batches skipped (rollback 1)" in res.stdout
    assert not any(incidents(run_dir, code) for code in ("crash", "oom", "nccl_timeout"))  # an end on purpose
