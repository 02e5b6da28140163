"""Two "nodes" on loopback, each with its own run directory: rank 0's node holds the checkpoints."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys

import pytest

from .runner import REPO, _env, events, finish, logs, make_run, steps_by_attempt

OVER = {"train": {"max_steps": 10}, "checkpoint": {"every_steps": 3}, "model": {"dropout": 0.1}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_node_job(nodes, attempt: int) -> None:
    port = free_port()
    procs = []
    for node_rank, run in enumerate(nodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=t{attempt}",
               "-m", "engine", "--run-dir", str(run), "--attempt", str(attempt)]
        log = open(run / f"launcher-{attempt}.log", "ab")
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT))
    for p, run in zip(procs, nodes):
        assert finish(p, run, 240) == 0, logs(run)


@pytest.mark.slow
def test_multinode_resume_without_a_shared_filesystem(tmp_path):
    node0 = make_run(tmp_path, "node0", **OVER)
    node1 = tmp_path / "node1"
    node1.mkdir()
    shutil.copy(node0 / "config.json", node1 / "config.json")
    two_node_job([node0, node1], attempt=1)
    assert [c["step"] for c in events(node0, "checkpoint")] == [3, 6, 9, 10]
    assert not (node1 / "checkpoints").exists() and not (node1 / "events.jsonl").exists()

    # the job's own first attempt is the uninterrupted reference (no third run): with the newer
    # checkpoints gone, the second attempt resumes from step 6 and must repeat steps 7-10 exactly
    for newer in ("step-9", "step-10"):
        shutil.rmtree(node0 / "checkpoints" / newer)
    two_node_job([node0, node1], attempt=2)  # node 1 cannot see step-6: rank 0 sends it
    node1_log = "".join(p.read_text() for p in (node1 / "logs").glob("rank*.log"))
    assert "received the checkpoint from rank 0" in node1_log
    start = [e for e in events(node0, "run_start") if e["attempt"] == 2][0]
    assert start["start_step"] == 6 and start["resumed_from"]["exact"] and start["nnodes"] == 2
    steps = steps_by_attempt(node0)
    ref = {s["step"]: (s["loss"], s["grad_norm"]) for s in steps[1]}
    after = steps[2]
    assert [s["step"] for s in after] == [7, 8, 9, 10]
    assert all((s["loss"], s["grad_norm"]) == ref[s["step"]] for s in after)
