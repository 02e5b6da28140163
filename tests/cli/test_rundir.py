"""The one liveness function: starting, live, lost, final, from status.json and a real process."""
from __future__ import annotations

import os
import subprocess

from tui.rundir import effective_state, liveness


def test_liveness_of_every_kind_of_status() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert liveness({"state": "running", "supervisor_pid": proc.pid}) == "live"
        assert liveness({"state": "running", "supervisor_pid": os.getpid()}) == "live"
    finally:
        proc.kill()
        proc.wait()
    assert liveness({"state": "running", "supervisor_pid": proc.pid}) == "lost"   # its process is gone
    assert effective_state({"state": "running", "supervisor_pid": proc.pid}) == "lost"
    assert liveness({"state": "starting", "supervisor_pid": None}) == "starting"
    for final in ("completed", "stopped", "failed", "killed"):
        assert liveness({"state": final, "supervisor_pid": os.getpid()}) == "final"
    for odd in ({}, {"state": 3}, {"state": "running", "supervisor_pid": True}, {"state": "running", "supervisor_pid": "1"}):
        assert liveness(odd) == "lost", odd
