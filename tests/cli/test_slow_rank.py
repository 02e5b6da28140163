"""The rank that holds the others back in synchronous DDP, named from the ranks' step anatomies
(real `mt launch`, 2 real CPU ranks, a user's dataset or model slow on rank 1 only)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import end_run, events, incidents, launch_user_run, mt, status, wait_for

pytestmark = pytest.mark.slow

# rank 1's items take 10 ms: 8 items a step (micro batch 4, 2 micro-steps) is ~80 ms of data wait
SLOW_DATA = {"factory": "my_data:slow", "args": {"rank": 1, "delay_s": 0.01}, "num_workers": 0}


def _opened(run_dir: Path, code: str, timeout: float) -> dict[str, Any]:
    return wait_for(lambda: next((r for r in incidents(run_dir, code) if r["status"] == "open"), None),
                    timeout, f"a {code} incident")


def _first_step_t(run_dir: Path) -> float:
    return wait_for(lambda: min((e["t"] for e in events(run_dir, "step")), default=None), 240, "the first step")


def test_a_rank_slow_on_its_data_is_named_input_bound_in_the_incident_and_the_views(tmp_path: Path) -> None:
    run_dir = launch_user_run(tmp_path, 2, SLOW_DATA, {}, max_steps=2000)
    try:
        first = _first_step_t(run_dir)
        inc = _opened(run_dir, "straggler", 60)
        ev = inc["evidence"]
        assert ev["rank"] == 1 and ev["bound"] == "input", inc
        assert inc["t"] - first <= 60
        assert inc["detail"].startswith("rank 1 is input-bound: it waits ") and "rank 0 waits ~" in inc["detail"], inc
        assert ev["anatomy"]["1"]["data_s"] > 0.03 and ev["anatomy"]["0"]["comm_s"] > 0.03, ev
        print(f"\nstraggler opened {inc['t'] - first:.1f} s after the first step: {inc['detail']}")
        once = mt("watch", run_dir, "--once")
        assert once.returncode == 0, once.stderr
        assert "rank 1 is input-bound" in once.stdout and "rank 1: step" in once.stdout, once.stdout
    finally:
        end_run(run_dir)


def test_a_rank_slow_in_its_forward_is_named_compute_bound(tmp_path: Path) -> None:
    model = {"factory": "my_models:slow_forward", "args": {"rank": 1, "delay_s": 0.03}}
    run_dir = launch_user_run(tmp_path, 2, {"factory": "my_data:build", "num_workers": 0}, {}, model=model, max_steps=2000)
    try:
        first = _first_step_t(run_dir)
        inc = _opened(run_dir, "straggler", 60)
        assert inc["evidence"]["rank"] == 1 and inc["evidence"]["bound"] == "compute", inc
        assert inc["t"] - first <= 60
    finally:
        end_run(run_dir)


def test_a_balanced_run_has_no_straggler(tmp_path: Path) -> None:
    # every rank's data is slow alike: both ranks wait for data, neither for the other
    data = {**SLOW_DATA, "args": {"rank": "all", "delay_s": 0.005}}
    run_dir = launch_user_run(tmp_path, 2, data, {}, max_steps=150)
    try:
        wait_for(lambda: status(run_dir).get("state") in ("completed", "failed"), 240, "the run's end")
        assert status(run_dir)["state"] == "completed"
        assert incidents(run_dir, "straggler") == []
        hb = json.loads((run_dir / "heartbeat" / "rank1").read_text())
        assert hb["anatomy"]["n"] == 20 and hb["anatomy"]["data_s"] > 0.02, hb  # it was measured, and judged
    finally:
        end_run(run_dir)


# mt's own engine: every rank's forward takes 0.25 s ([faults] step_work_s), rank 1's 50 ms more
WORK = {"step_work_s": 0.25, "slow_rank": 1}


def _engine_run(tmp_path: Path, slow_step_s: float, max_steps: int) -> Path:
    from tests.cli.conftest import write_preset

    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", train={"max_steps": max_steps},
                          checkpoint={"every_steps": 0}, faults={**WORK, "slow_step_s": slow_step_s})
    res = mt("launch", preset, "--detach", "--name", "slow")
    assert res.returncode == 0, res.stdout + res.stderr
    return Path(res.stdout.strip())


def test_a_rank_ten_percent_slower_for_30_s_is_named(tmp_path: Path) -> None:
    run_dir = _engine_run(tmp_path, 0.05, 1000)
    try:
        first = _first_step_t(run_dir)
        inc = _opened(run_dir, "straggler", 120)
        ev = inc["evidence"]
        assert ev["rank"] == 1 and ev["bound"] == "compute", inc
        share = ev["gap_s"] / ev["step_s"]
        print(f"\nstraggler opened {inc['t'] - first:.1f} s after the first step: gap {ev['gap_s'] * 1000:.0f} ms, "
              f"{share:.0%} of a {ev['step_s'] * 1000:.0f} ms step, held {ev['held_s']} s")
        assert 0.1 <= share < 0.2 and ev["held_s"] >= 30.0, ev   # under the old 20% bar: named by its 30 s
        assert inc["t"] - first <= 60
    finally:
        end_run(run_dir)


def test_a_balanced_run_of_the_same_pace_has_no_straggler(tmp_path: Path) -> None:
    run_dir = _engine_run(tmp_path, 0.0, 160)   # ~42 s of 0.26 s steps: past the window's 20 steps and 30 s more
    try:
        first = _first_step_t(run_dir)
        wait_for(lambda: status(run_dir).get("state") in ("completed", "failed"), 240, "the run's end")
        assert status(run_dir)["state"] == "completed"
        steps = events(run_dir, "step")
        assert steps[-1]["t"] - first >= 30 + 20 * 0.25, "too short to have been judged for 30 s"
        assert incidents(run_dir, "straggler") == []
    finally:
        end_run(run_dir)
