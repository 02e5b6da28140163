"""The test cluster is a real Slurm, and the behaviours mt relies on work on it.

Two slurmd (nodes n1, n2) on one machine: a 2-node step runs a task on each; a batch job catches
USR1 (from `scancel --signal=USR1 --batch`, or from `sbatch --signal=B:USR1@N`), requeues itself
and runs again with SLURM_RESTART_COUNT=1; a held pending job says so in squeue; scancel leaves
no process of the job on either node."""
from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tests.cluster.conftest import Cluster

pytestmark = pytest.mark.slow

# The batch script of the requeue tests. The trap comes first: the signal may come early.
# Its events go to ./events, one a line; the second attempt (SLURM_RESTART_COUNT=1) only says so.
REQUEUE_JOB = """#!/bin/bash
trap 'echo "usr1 $n" >>events; kill $child; scontrol requeue "$SLURM_JOB_ID" && echo requeued >>events; exit 0' USR1
n=${SLURM_RESTART_COUNT:-0}
echo "start $n $SLURMD_NODENAME" >>events
if ((n >= 1)); then echo "done $n" >>events; exit 0; fi
sleep 300 & child=$!
echo ready >>events
wait $child
"""


def test_a_two_node_step_runs_one_task_on_each_node(slurm: Cluster) -> None:
    nodes = slurm.run("srun", "-N2", "-l", "printenv", "SLURMD_NODENAME").stdout.split("\n")
    assert sorted(line.strip() for line in nodes if line.strip()) == ["0: n1", "1: n2"]
    # both nodes up (idle, or running or ending another test's job: not down, drained or not responding)
    info = dict(line.split() for line in slurm.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.splitlines())
    assert info.keys() == {"n1", "n2"} and set(info.values()) <= {"idle", "mixed", "allocated", "completing"}, info


def _events(folder: Path) -> list[str]:
    f = folder / "events"
    return f.read_text().splitlines() if f.exists() else []


@pytest.mark.parametrize("signal_from", ["scancel", "sbatch"])
def test_b_usr1_requeues_the_batch_job_and_it_runs_again(slurm: Cluster, tmp_path: Path, signal_from: str) -> None:
    (tmp_path / "job.sh").write_text(REQUEUE_JOB)
    opts = ["--requeue", "-N1", "-o", "out.%j", "-D", str(tmp_path)]
    if signal_from == "sbatch":
        # USR1 to the batch shell 25 s before the 1-minute limit. Slurm checks time limits every
        # 30 s and sends the signal up to that much early: here 5 to 35 s after the start.
        opts += ["--time=1", "--signal=B:USR1@25"]
    job = slurm.sbatch(*opts, "job.sh", cwd=tmp_path)
    slurm.wait_for("the batch shell's trap", lambda: "ready" in _events(tmp_path))
    if signal_from == "scancel":
        slurm.run("scancel", "--signal=USR1", "--batch", job)
    # Slurm sends the signal up to 35 s after the start, then requeues: a busy machine only makes that later
    slurm.wait_for("USR1 and the requeue", lambda: "requeued" in _events(tmp_path), timeout=180)
    # A requeued job may start again only after AuthInfo's cred_expire + 1 s (120 s by default, 10
    # in the test cluster's slurm.conf): the test shortens the wait with StartTime, as the real
    # tests may. Not StartTime=now: a launch in the same second as the requeue is refused on the
    # node ("Job credential revoked": the revocation is kept to the second) and the job ends FAILED.
    def again() -> str | None:
        if any(e.startswith("start 1") for e in _events(tmp_path)):
            return "started"
        state = slurm.state(job)
        return state if state.startswith("PENDING") else None

    if slurm.wait_for("the job pending again", again) != "started":
        slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now+2")
    slurm.wait_for("the second attempt", lambda: "done 1" in _events(tmp_path), timeout=30)
    events = _events(tmp_path)
    assert events[:4] == ["start 0 n1", "ready", "usr1 0", "requeued"] or events[:4] == ["start 0 n2", "ready", "usr1 0", "requeued"]
    assert events[4].startswith("start 1 ") and events[5:] == ["done 1"]
    slurm.wait_for("the job completed", lambda: slurm.state(job) in ("", "COMPLETED,None"))


def test_c_a_held_pending_job_shows_pending_with_a_reason(slurm: Cluster, tmp_path: Path) -> None:
    # pending because it may not begin for an hour; then held by the admin (root), then by its user
    job = slurm.sbatch("--begin=now+3600", "-o", "/dev/null", "-D", str(tmp_path), "--wrap", "true")
    try:
        slurm.wait_for("the job pending for its begin time", lambda: slurm.state(job) == "PENDING,BeginTime")
        slurm.run("scontrol", "hold", job)
        assert slurm.state(job) == "PENDING,JobHeldAdmin"
        slurm.run("scontrol", "release", job)
        slurm.run("scontrol", "uhold", job)
        assert slurm.state(job) == "PENDING,JobHeldUser"
    finally:
        slurm.run("scancel", job, check=False)


def _job_processes(slurm: Cluster, job: str) -> list[tuple[int, str, str]]:
    """(pid, node, command line) of every live process of the job on this machine: its tasks and
    their children (SLURM_JOB_ID in their environment, our SLURM_CONF) and its slurmstepd."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            if cmd.startswith("slurmstepd:") and f"[{job}." in cmd:
                found.append((p.pid, "", cmd))
                continue
            env = p.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get("SLURM_JOB_ID") == job and env.get("SLURM_CONF") == str(slurm.conf):
            found.append((p.pid, env.get("SLURMD_NODENAME", ""), cmd))
    return found


def test_d_scancel_leaves_no_process_of_the_job_on_either_node(slurm: Cluster, tmp_path: Path) -> None:
    # a batch shell on n1, and a 2-node step whose tasks each start children
    script = "srun -N2 bash -c 'sleep 300 & sleep 301 & wait'\n"
    job = slurm.sbatch("-N2", "-o", "out.%j", "-D", str(tmp_path), "--wrap", script)

    def on_both_nodes() -> list[tuple[int, str, str]] | None:
        procs = _job_processes(slurm, job)
        sleeps = {node for _, node, cmd in procs if cmd.startswith("sleep 30")}
        return procs if sleeps == {"n1", "n2"} and len([1 for _, _, c in procs if c.startswith("sleep")]) == 4 else None

    procs = slurm.wait_for("the job's sleeps on n1 and n2", on_both_nodes, timeout=30)
    assert any(cmd.startswith("slurmstepd:") for _, _, cmd in procs)
    slurm.run("scancel", job)
    slurm.wait_for("no process of the job left", lambda: not _job_processes(slurm, job), timeout=30)
    assert slurm.wait_for("the job out of squeue's running", lambda: slurm.state(job) in ("", "CANCELLED,None") or None)
