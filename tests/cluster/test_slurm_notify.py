"""[monitor] notify in a Slurm job of two nodes (n1, n2 of the test cluster): only the job's supervisor
(node 0) tells, of an incident on the other node and of the job's end, each once."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import MT, REPO, events, run_dir_from, status, write_preset
from tests.cluster.conftest import Cluster
from tests.mirror.receiver import receiver

pytest.importorskip("apprise")
pytestmark = pytest.mark.slow


def test_a_two_node_job_notifies_from_node_0_only(slurm: Cluster, tmp_path: Path) -> None:
    with receiver() as rec:
        preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 1, "nnodes": 2, "max_restarts": 0},
                              train={"max_steps": 10_000, "warmup_steps": 1}, checkpoint={"every_steps": 1000},
                              faults={"step_sleep_s": 0.1}, slurm={"time": "0:05:00"}, monitor={"notify": [rec.url()]})
        done = subprocess.run([*MT, "launch", str(preset), "--slurm"], capture_output=True, text=True, timeout=120, cwd=REPO,
                              env={**slurm.env, "PYTHONUNBUFFERED": "1"})
        assert done.returncode == 0, done.stderr
        run_dir = run_dir_from(done.stdout)
        slurm.wait_for("a few steps", lambda: len(events(run_dir, "step")) >= 3, timeout=120, every=0.5)
        pids = slurm.wait_for("n2's worker pid", lambda: status(run_dir / "nodes" / "n2").get("worker_pids"), timeout=30)
        os.kill(pids["1"], signal.SIGKILL)
        slurm.wait_for("the job's end", lambda: status(run_dir).get("state") in ("failed", "completed", "stopped", "killed")
                       or None, timeout=120)
        got = slurm.wait_for("the crash and the end told", lambda: len(rec.received()) >= 2 and rec.received(), timeout=60)
        slurm.wait_for("the job to leave the queue", lambda: slurm.state(status(run_dir)["slurm_job_id"]) == "" or None,
                       timeout=60)
        got = rec.received()   # n2's supervisor has ended too: it told nothing
    titles = [g.title for g in got]
    assert len(titles) == 2 and titles[1] == f"mt {run_dir.name}: failed", titles
    assert titles[0].startswith(f"mt {run_dir.name}: Worker crashed: rank 1 on node n2"), titles
    assert "rank 1 on node n2" in got[0].message.splitlines()[0] and "SIGKILL" in got[0].message, got[0].message
    assert "failed (rank 1 on node n2 was killed by signal 9 (SIGKILL)" in got[1].message, got[1].message
    n1_log = (run_dir / "nodes" / "n1" / "logs" / "supervisor.log").read_text()
    n2_log = (run_dir / "nodes" / "n2" / "logs" / "supervisor.log").read_text()
    assert "notifying 1 services" in n1_log and "notified " in n1_log
    assert "notifying" not in n2_log and "notified " not in n2_log and "notification" not in n2_log
