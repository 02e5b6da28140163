"""A hang named within seconds of the last step, never on a clean run's slow checkpoints, and a
hung attempt ended after [monitor] hang_timeout_s and restarted (real `mt launch`, 2 CPU ranks)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import PidTracker, end_run, events, incidents, mt, status, wait_for, write_preset

pytestmark = pytest.mark.slow

FAST = {"step_sleep_s": 0.1}   # ~0.1 s steps (the 1-layer model's own compute is a few ms)


def _launch(tmp_path: Path, **sections: dict[str, Any]) -> Path:
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", **sections)
    res = mt("launch", preset, "--detach", "--name", "hang")
    assert res.returncode == 0, res.stdout + res.stderr
    return Path(res.stdout.strip())


def test_a_hang_is_on_disk_with_the_stuck_rank_and_its_frame_within_10_s_of_the_last_step(tmp_path: Path) -> None:
    run_dir = _launch(tmp_path, train={"max_steps": 400, "log_every": 1}, checkpoint={"every_steps": 0},
                      faults={**FAST, "hang_at_step": 40, "hang_rank": 1}, monitor={"hang_timeout_s": 0})
    try:
        def stacks() -> dict[str, Any] | None:
            return next((r for r in incidents(run_dir, "hang") if r["status"] == "update" and "groups" in r["evidence"]), None)
        upd = wait_for(stacks, 240, "the hang's stacks")
        opened = next(r for r in incidents(run_dir, "hang") if r["status"] == "open")
        last = max(e["t"] for e in events(run_dir, "step"))
        ev = upd["evidence"]
        assert ev["suspect_ranks"] == [1] and ev["early"] is True, opened
        assert ev["groups"][0]["ranks"] == [1] and ev["frames"][0].startswith("rank 1: before_step (engine/faults.py:"), ev
        print(f"\nlast step -> hang open {opened['t'] - last:.1f} s, -> its stacks {upd['t'] - last:.1f} s: {ev['verdict']}")
        assert upd["t"] - last <= 10.0, (opened["t"] - last, upd["t"] - last)
    finally:
        end_run(run_dir)


def test_a_clean_run_with_evals_and_slow_checkpoints_raises_no_hang(tmp_path: Path) -> None:
    # each checkpoint: rank 0 asleep 4 s in its write while rank 1 waits in the barrier, as a hang looks
    run_dir = _launch(tmp_path, train={"max_steps": 40, "log_every": 1, "eval_every": 10, "eval_batches": 4},
                      checkpoint={"every_steps": 10}, faults={**FAST, "slow_checkpoint_s": 4.0})
    try:
        wait_for(lambda: status(run_dir).get("state") in ("completed", "failed"), 240, "the run's end")
        assert status(run_dir)["state"] == "completed", status(run_dir)
        ckpts = events(run_dir, "checkpoint")
        assert len(ckpts) == 4 and all(c["seconds"] >= 4.0 for c in ckpts), ckpts
        assert incidents(run_dir, "hang") == []
    finally:
        end_run(run_dir)


def test_a_hung_attempt_is_ended_after_hang_timeout_s_and_restarted_from_its_checkpoint(tmp_path: Path) -> None:
    run_dir = _launch(tmp_path, launch={"max_restarts": 1}, train={"max_steps": 40, "log_every": 1},
                      checkpoint={"every_steps": 10}, faults={**FAST, "hang_at_step": 25, "hang_rank": 1},
                      monitor={"hang_timeout_s": 2.0})
    tracker = PidTracker(run_dir)
    try:
        wait_for(lambda: tracker.collect() and status(run_dir).get("state") in ("completed", "failed"), 240, "the run's end")
        st = status(run_dir)
        assert st["state"] == "completed" and st["attempt"] == 2, st
        starts = events(run_dir, "run_start")
        assert [s["start_step"] for s in starts] == [0, 20], starts   # the restart resumed from step 20's checkpoint
        hang = next(r for r in incidents(run_dir, "hang") if r["status"] == "open")
        assert hang["evidence"]["suspect_ranks"] == [1], hang
        assert starts[1]["t"] - hang["t"] >= 2.0
        assert not [r for r in map(json.loads, (run_dir / "incidents.jsonl").read_text().splitlines())
                    if r["code"] in ("crash", "oom")], "the ended attempt was read as a crash"
        log = (run_dir / "logs" / "supervisor.log").read_text()
        assert "hang: mt ended the attempt 2 s after the verdict" in log
        wait_for(lambda: tracker.alive() == [], 30, "the run's processes to end")
    finally:
        end_run(run_dir)
