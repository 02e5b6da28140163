"""One run directory has at most one supervisor: two `mt resume` at once, or a stray supervisor."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.cli.conftest import MT, REPO, events, mt, status, wait_for, write_preset

pytestmark = pytest.mark.slow


def supervisors(run_dir: Path) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "tui.supervise.supervisor_main" in cmd and str(run_dir) in cmd:
            out.append(p.pid)
    return out


def test_two_resumes_at_once_start_one_supervisor(tmp_path: Path, runs: Path) -> None:
    preset = write_preset(tmp_path / "p.toml", runs, launch={"nproc_per_node": 1}, train={"max_steps": 400},
                          checkpoint={"every_steps": 2}, faults={"step_sleep_s": 0.05})
    res = mt("launch", preset, "--detach")
    assert res.returncode == 0, res.stderr
    run_dir = Path(res.stdout.strip())
    try:
        wait_for(lambda: events(run_dir, "checkpoint"), 180, "a checkpoint")
        # a second supervisor started by hand on a live run refuses before touching anything
        stray = subprocess.run([sys.executable, "-m", "tui.supervise.supervisor_main", "--run-dir", str(run_dir)],
                               capture_output=True, text=True, cwd=REPO, timeout=60)
        holder = status(run_dir)["supervisor_pid"]
        assert stray.returncode == 2 and f"held by supervisor pid {holder}" in stray.stderr, stray.stderr
        assert mt("stop", run_dir, "--timeout", "120").returncode == 0
        wait_for(lambda: not supervisors(run_dir), 60, "the supervisor to exit")

        for _ in range(3):  # the race is tight: try it more than once
            procs = [subprocess.Popen([*MT, "resume", str(run_dir), "--detach"], cwd=REPO, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
            outs = [p.communicate(timeout=120) for p in procs]
            codes = sorted(p.returncode for p in procs)
            loser = next((err for p, (_, err) in zip(procs, outs) if p.returncode == 2), "")
            assert codes == [0, 2], outs
            assert "held by" in loser and loser.count("\n") == 1, loser
            wait_for(lambda: status(run_dir).get("state") == "running", 120, "the resumed run")
            assert len(supervisors(run_dir)) == 1
            assert mt("stop", run_dir, "--timeout", "120").returncode == 0
            wait_for(lambda: not supervisors(run_dir), 60, "the supervisor to exit")
        attempts = [s["attempt"] for s in events(run_dir, "run_start")]
        assert attempts == [1, 2, 3, 4]  # each pair started exactly one attempt
    finally:
        mt("kill", run_dir)
