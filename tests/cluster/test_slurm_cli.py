"""Slurm as a new user drives it (issue #34 items 7, 8, 9): a script's shape options (--nnodes,
--nproc), `--headless` following the job to its end, no option silently dropped, and a requeue by
hand (`scontrol requeue`) recorded as one, with `mt stop`/`mt resume`/`mt kill` coherent while the
job waits in the queue. The quick tests need no cluster; the others use the `slurm` fixture (slow)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import MT, REPO, events, run_dir_from, status, write_preset
from tests.cluster.conftest import Cluster

SCRIPT = REPO / "tests" / "library" / "scripts" / "plain_loop.py"   # the mt library, no torch: fast
FINAL = ("completed", "failed", "killed", "stopped")


def _mt(*args: Any, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MT, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"})


def _two_nodes(tmp_path: Path, steps: int, sleep_s: float, **launch: Any) -> Path:
    return write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 1, "nnodes": 2, **launch},
                        train={"max_steps": steps, "warmup_steps": 1}, checkpoint={"every_steps": 1000},
                        faults={"step_sleep_s": sleep_s}, slurm={"time": "0:05:00"})


def _sup_log(run_dir: Path, node: str) -> str:
    path = run_dir / "nodes" / node / "logs" / "supervisor.log"
    return path.read_text(errors="replace") if path.is_file() else ""


def test_a_scripts_shape_options_give_the_allocation(tmp_path: Path) -> None:
    done = _mt("launch", SCRIPT, "--slurm", "--dry-run", "--nnodes", "2", "--nproc", "1", "--runs-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=1" in lines, done.stdout
    bad = _mt("launch", SCRIPT, "--slurm", "--dry-run", "--nnodes", "0", "--runs-dir", tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("mt: --nnodes 0") and len(bad.stderr.splitlines()) == 1, bad.stderr


@pytest.mark.parametrize(("args", "says"), [
    (("--node-rank", "1"), "--node-rank: not with --slurm"),
    (("--dry-run", "--headless"), "--headless: not with --dry-run"),
    (("--dry-run", "--detach"), "--detach: not with --dry-run"),
    (("--detach", "--headless"), "--detach and --headless: choose one"),
])
def test_an_option_that_cannot_apply_to_a_slurm_launch_is_refused_in_one_line(tmp_path: Path, args: tuple[str, ...],
                                                                            says: str) -> None:
    done = _mt("launch", SCRIPT, "--slurm", *args, "--runs-dir", tmp_path / "runs")
    assert done.returncode == 2 and done.stderr.startswith(f"mt: {says}") and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_script_on_two_nodes_headless_follows_the_job_to_its_end(slurm: Cluster, tmp_path: Path) -> None:
    """`mt launch train.py --slurm --nnodes 2 --nproc 1 --headless`: a 2-node job (squeue says 2), the
    follower prints pending, running and the end, and exits with the run's code."""
    cmd = [*MT, "launch", str(SCRIPT), "--slurm", "--nnodes", "2", "--nproc", "1", "--headless", "--runs-dir",
           str(tmp_path / "runs"), "--", "--steps", "40", "--sleep", "0.1"]
    follower = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                env={**slurm.env, "PYTHONUNBUFFERED": "1"})
    try:
        run_dir = slurm.wait_for("the run directory", lambda: next((tmp_path / "runs").glob("plain_loop*/status.json"), None),
                                 timeout=60).parent
        job = slurm.wait_for("the job id", lambda: status(run_dir).get("slurm_job_id"), timeout=30)
        nodes = slurm.wait_for("the job to run", lambda: slurm.run("squeue", "-h", "-j", job, "-t", "R", "-o", "%D",
                                                                    check=False).stdout.strip(), timeout=60)
        assert nodes == "2", nodes
        out, err = follower.communicate(timeout=180)
    finally:
        follower.kill()
        follower.wait()
    assert follower.returncode == 0, f"{out}\n{err}"
    lines = out.splitlines()
    assert lines[:2] == [f"run dir: {run_dir}", f"slurm job: {job}"], out
    assert any(ln.startswith(f"state: pending: Slurm job {job}") for ln in lines), out
    assert f"state: running: Slurm job {job}, attempt 1" in lines, out
    assert lines[-1].startswith("run completed") and lines[-1].endswith(str(run_dir)), out
    final = status(run_dir)
    assert (final["state"], final["nnodes"]) == ("completed", 2), final
    assert {p.name for p in (run_dir / "nodes").iterdir()} == {"n1", "n2"}


@pytest.mark.slow
def test_headless_exits_with_a_failed_slurm_runs_code(slurm: Cluster, tmp_path: Path) -> None:
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 1, "max_restarts": 0},
                          train={"max_steps": 20, "warmup_steps": 1}, faults={"crash_at_step": 3},
                          slurm={"time": "0:05:00"})
    done = _mt("launch", preset, "--slurm", "--headless", env=slurm.env, timeout=180)
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr}"
    run_dir = run_dir_from(done.stdout)
    assert status(run_dir)["state"] == "failed"
    assert "state: running: Slurm job " in done.stdout and done.stdout.splitlines()[-1].startswith("run failed"), done.stdout


@pytest.mark.slow
def test_a_requeue_by_hand_is_pending_and_the_next_attempt_runs_on_both_nodes(slurm: Cluster, tmp_path: Path) -> None:
    """`scontrol requeue JOB` mid-run: recorded as a requeue (REQUEUED, never stopped/CANCELLED), `mt resume`
    says it is already queued, and attempt 2 runs on n1 and n2 and completes."""
    done = _mt("launch", _two_nodes(tmp_path, steps=30, sleep_s=0.15), "--slurm", env=slurm.env)
    assert done.returncode == 0, done.stderr
    run_dir = run_dir_from(done.stdout)
    job = status(run_dir)["slurm_job_id"]
    try:
        slurm.wait_for("a few steps", lambda: len(events(run_dir, "step")) >= 3, timeout=120, every=0.5)
        slurm.run("scontrol", "requeue", job)
        said = slurm.wait_for("the requeue recorded", lambda: status(run_dir).get("slurm_state") == "REQUEUED" and status(run_dir),
                              timeout=60, every=0.2)
        # pending once its supervisor recorded the end; stopping if Slurm killed it first (KillWait)
        assert said["state"] in ("stopping", "pending") and said["reason"].startswith(f"requeued in Slurm (job {job}"), said
        slurm.wait_for("the job pending again", lambda: slurm.state(job).startswith("PENDING"), timeout=60)
        if status(run_dir)["attempt"] == 1:
            again = _mt("resume", run_dir, env=slurm.env)
            assert again.returncode == 0 and f"already queued: Slurm job {job} is PENDING" in again.stdout, again
            assert status(run_dir)["slurm_job_id"] == job   # not submitted twice
        slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now+2", check=False)   # docs/slurm-testing.md
        final = slurm.wait_for("the run to end", lambda: status(run_dir).get("state") in FINAL and status(run_dir),
                               timeout=180, every=0.5)
    finally:
        slurm.run("scancel", job, check=False)
    logs = _sup_log(run_dir, "n1") + _sup_log(run_dir, "n2")
    assert (final["state"], final["attempt"]) == ("completed", 2), logs
    assert "did not start attempt" not in logs and "CANCELLED" not in logs, logs
    assert [e["attempt"] for e in events(run_dir, "run_start")] == [1, 2]
    # the requeue's SIGTERM (and KillWait's SIGKILL) ended attempt 1: no worker crashed
    crashes = [json.loads(line) for line in (run_dir / "incidents.jsonl").read_text().splitlines()
               if '"code":"crash"' in line] if (run_dir / "incidents.jsonl").is_file() else []
    assert crashes == [], crashes
    n2 = status(run_dir / "nodes" / "n2") if (run_dir / "nodes" / "n2" / "status.json").is_file() else {}
    assert (n2.get("state"), n2.get("attempt")) == ("completed", 2), n2


@pytest.mark.slow
def test_stop_and_kill_of_a_pending_job_cancel_it(slurm: Cluster, tmp_path: Path) -> None:
    """A job waiting in the queue: `mt stop` cancels it and records `stopped`; `mt kill` cancels it, `killed`."""
    for verb, state in (("stop", "stopped"), ("kill", "killed")):
        preset = write_preset(tmp_path / f"{verb}.toml", tmp_path / verb, launch={"nproc_per_node": 1},
                              slurm={"extra": ["--begin=now+600"]})
        done = _mt("launch", preset, "--slurm", env=slurm.env)
        assert done.returncode == 0, done.stderr
        run_dir = run_dir_from(done.stdout)
        job = status(run_dir)["slurm_job_id"]
        assert slurm.state(job).startswith("PENDING")
        acted = _mt(verb, run_dir, env=slurm.env)
        assert acted.returncode == 0, f"{acted.stdout}\n{acted.stderr}"
        assert slurm.state(job) == "" and status(run_dir)["state"] == state, (acted.stdout, status(run_dir))
        if verb == "stop":
            assert acted.stdout.startswith(f"run stopped (stopped while pending in Slurm: job {job} cancelled"), acted.stdout
