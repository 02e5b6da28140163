"""The epoch beside the step: an engine run's whole epoch in its events and every view (the Trainer's
fractional one: tests/library/test_script_runs.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import events, mt, write_preset

pytestmark = pytest.mark.slow


def test_an_engine_run_logs_and_shows_its_whole_epoch(tmp_path: Path, runs: Path) -> None:
    # 64 synthetic samples, 8 a step on 2 ranks (a val split of 5% aside): past two epochs in 20 steps
    preset = write_preset(tmp_path / "p.toml", runs, train={"max_steps": 20}, data={"synthetic_samples": 64},
                          checkpoint={"every_steps": 0})
    res = mt("launch", preset, "--headless", "--every", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = Path(next(ln for ln in res.stdout.splitlines() if ln.startswith("run dir: ")).split(": ", 1)[1])
    steps = events(run_dir, "step")
    epochs = [s["epoch"] for s in steps]
    assert all(type(e) is int for e in epochs) and epochs == sorted(epochs) and epochs[-1] >= 2, epochs
    last = steps[-1]
    assert f"step 20/20  epoch {last['epoch']}  loss" in res.stdout, res.stdout
    assert f"step 20/20  epoch {last['epoch']}  elapsed" in mt("watch", run_dir, "--once").stdout
    assert f"20/20 ep {last['epoch']}" in mt("ls", runs).stdout
