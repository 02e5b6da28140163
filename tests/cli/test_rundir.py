"""The one liveness function: starting, live, lost, final, from status.json and a real process."""
from __future__ import annotations

import os
import subprocess

from mt.contract.status import Status
from tui.read.rundir import effective_state, liveness


def test_liveness_of_every_kind_of_status() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert liveness(Status.parse({"state": "running", "supervisor_pid": proc.pid})) == "live"
        assert liveness(Status.parse({"state": "running", "supervisor_pid": os.getpid()})) == "live"
    finally:
        proc.kill()
        proc.wait()
    assert liveness(Status.parse({"state": "running", "supervisor_pid": proc.pid})) == "lost"   # its process is gone
    assert effective_state(Status.parse({"state": "running", "supervisor_pid": proc.pid})) == "lost"
    assert liveness(Status.parse({"state": "starting", "supervisor_pid": None})) == "starting"
    for final in ("completed", "stopped", "failed", "killed"):
        assert liveness(Status.parse({"state": final, "supervisor_pid": os.getpid()})) == "final"
    for odd in ({}, {"state": 3}, {"state": "running", "supervisor_pid": True}, {"state": "running", "supervisor_pid": "1"}):
        assert liveness(Status.parse(odd)) == "lost", odd


def test_kill_never_signals_a_recorded_pid_that_now_belongs_to_another_program(tmp_path) -> None:
    """status.json outlives its processes: a pid it names may have been reused by now."""
    from tests.cli.conftest import mt
    from tests.tui.synth import finished_run, write_status

    run = tmp_path / "run"
    r = finished_run(run)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        write_status(r.paths, {"state": "completed", "supervisor_pid": bystander.pid,
                               "torchrun_pid": bystander.pid, "worker_pids": {"0": bystander.pid}})
        res = mt("kill", run)
        assert res.returncode == 2 and "nothing to kill" in res.stderr, res.stderr
        assert bystander.poll() is None  # still alive: never signalled
    finally:
        bystander.kill()
        bystander.wait()
