"""`mt launch PRESET --slurm` on the real test cluster: the batch script, a one-node job that runs
to completion under its foreground supervisor, and a held job that reads `pending`.

The quick tests (the script of --dry-run, bad [slurm] values, Slurm's node identity) need no
cluster; the others use the `slurm` fixture (slow)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mt.contract.config import LaunchConfig
from mt.contract.status import Status, judge
from tests.cli.conftest import MT, REPO, events, run_dir_from, status, write_preset
from tests.cluster.conftest import Cluster
from tui.cluster.slurm import rendezvous_port, slurm_launch

SLURM = {"partition": "debug", "time": "0:05:00", "signal_grace_s": 30, "cpus_per_task": 1,
         "extra": ["--exclusive", "#SBATCH --comment=mt-test"]}


def _mt(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`mt ARGS` as a real process; `env` replaces the environment (the cluster's SLURM_CONF)."""
    return subprocess.run([*MT, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"})


def _preset(tmp_path: Path, **slurm: object) -> Path:
    return write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 1},
                        train={"max_steps": 6, "warmup_steps": 1}, checkpoint={"every_steps": 3},
                        slurm={**SLURM, **slurm})


def test_dry_run_prints_the_batch_script_with_the_slurm_values_and_makes_nothing(tmp_path: Path) -> None:
    done = _mt("launch", _preset(tmp_path), "--slurm", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "#!/bin/bash"
    for want in ("--nodes=1", "--ntasks-per-node=1", "--partition=debug", "--time=0:05:00", "--cpus-per-task=1",
                 "--signal=B:USR1@30", "--exclusive", "--comment=mt-test"):
        assert f"#SBATCH {want}" in lines, want
    out = next(line for line in lines if line.startswith("#SBATCH --output="))
    assert out.startswith(f"#SBATCH --output={(tmp_path / 'runs').resolve()}/t-") and out.endswith("/slurm/job-%j.out")
    step = next(line for line in lines if line.startswith("srun "))
    assert "--ntasks-per-node=1" in step and "-m tui.supervise.supervisor" in step and step.endswith("--slurm' &")
    assert not (tmp_path / "runs").exists()   # nothing submitted, no run directory


@pytest.mark.parametrize(("key", "value", "says"), [
    ("time", "10 min", "slurm.time: expected Slurm's time format"),
    ("time", "1:2:3:4", "slurm.time"),
    ("partition", "a b", "slurm.partition"),
    ("signal_grace_s", -1, "slurm.signal_grace_s: expected an integer >= 0"),
    ("cpus_per_task", "2", "slurm.cpus_per_task: expected an integer"),
    ("extra", ["hold"], "slurm.extra[0]"),
    ("extra", ["--a --b"], "slurm.extra[0]: one option per entry"),
    ("extra", "--hold", "slurm.extra: expected a list of strings"),
    ("gres", "gpu:1", "slurm.gres: unknown key"),
])
def test_bad_slurm_values_exit_2_naming_the_key(tmp_path: Path, key: str, value: object, says: str) -> None:
    preset = _preset(tmp_path, **{key: value})
    done = _mt("launch", preset, "--slurm", "--dry-run")
    assert done.returncode == 2
    assert done.stderr.startswith(f"mt: {preset}: {says}") and len(done.stderr.splitlines()) == 1, done.stderr


def test_dry_run_needs_slurm(tmp_path: Path) -> None:
    done = _mt("launch", _preset(tmp_path), "--dry-run")
    assert done.returncode == 2 and "--dry-run: only with --slurm" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_without_sbatch_it_exits_2_and_leaves_no_run(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(Path(os.__file__).parent)}   # a PATH with no sbatch on it
    done = _mt("launch", _preset(tmp_path), "--slurm", env=env)
    assert done.returncode == 2 and "sbatch not found on PATH" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


def test_one_node_takes_todays_loopback_and_several_meet_on_the_first_node() -> None:
    one = slurm_launch(LaunchConfig(nproc_per_node=2), {"SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7",
                                                        "SLURM_JOB_NODELIST": "n1"})
    assert (one.nnodes, one.node_rank, one.rdzv_endpoint, one.nproc_per_node) == (1, 0, "", 2)
    two = slurm_launch(LaunchConfig(), {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_ID": "7",
                                        "SLURM_JOB_NODELIST": "gpu-07,gpu-08"})
    assert (two.nnodes, two.node_rank, two.rdzv_endpoint) == (2, 1, f"gpu-07:{rendezvous_port('7')}")


def test_pending_is_neither_live_nor_final_and_keeps_its_job_id() -> None:
    st = Status.parse({"state": "pending", "slurm_job_id": "42", "supervisor_pid": 1})
    assert judge(st, lambda _: False) == "pending" and not st.is_final
    assert st.to_dict()["slurm_job_id"] == "42"
    assert Status.parse({"state": "pending", "slurm_job_id": "4; rm"}).invalid == {"slurm_job_id"}


def _ls(runs: Path, env: dict[str, str] | None = None) -> str:
    done = _mt("ls", runs, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[1]


@pytest.mark.slow
def test_a_one_node_job_runs_to_completion(slurm: Cluster, tmp_path: Path) -> None:
    done = _mt("launch", _preset(tmp_path, partition="", extra=[]), "--slurm", env=slurm.env)
    assert done.returncode == 0, done.stderr
    run_dir = run_dir_from(done.stdout)
    job = next(line.split()[-1] for line in done.stdout.splitlines() if line.startswith("slurm job: "))
    assert status(run_dir)["slurm_job_id"] == job
    final = slurm.wait_for("the run to complete", lambda: status(run_dir)["state"] in
                           ("completed", "failed", "killed", "stopped") and status(run_dir), timeout=120)
    log = run_dir / "logs" / "supervisor.log"
    assert final["state"] == "completed", log.read_text()
    assert [e["step"] for e in events(run_dir, "step")] == list(range(1, 7))
    assert (run_dir / "slurm" / "job.sh").is_file()
    slurm.wait_for("the job to leave the queue", lambda: slurm.state(job) == "" or None, timeout=30)
    out = run_dir / "slurm" / f"job-{job}.out"
    assert out.is_file()
    assert f"slurm job {job}, node n1 (node rank 0 of 1)" in log.read_text()
    row = _ls(tmp_path / "runs")
    assert " completed " in row, row


@pytest.mark.slow
def test_a_held_job_reads_pending_and_a_cancel_keeps_it_recorded(slurm: Cluster, tmp_path: Path) -> None:
    done = _mt("launch", _preset(tmp_path, partition="", extra=["--hold"]), "--slurm", env=slurm.env)
    assert done.returncode == 0, done.stderr
    assert "(held: scontrol release it to start)" in done.stdout
    run_dir = run_dir_from(done.stdout)
    job = status(run_dir)["slurm_job_id"]
    assert slurm.state(job).startswith("PENDING,JobHeld")
    assert status(run_dir)["state"] == "pending"
    assert " pending " in _ls(tmp_path / "runs")
    once = _mt("watch", run_dir, "--once", env=slurm.env)
    assert once.returncode == 0, once.stderr
    assert f"pending: Slurm job {job} PENDING (JobHeld" in once.stdout, once.stdout
    # `mt watch --headless` follows it until Slurm's cancel, recorded with Slurm's word (it waited forever before)
    follow = subprocess.Popen([*MT, "watch", str(run_dir), "--headless"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**slurm.env, "PYTHONUNBUFFERED": "1"})
    slurm.run("scancel", job)
    slurm.wait_for("the job to leave the queue", lambda: slurm.state(job) == "" or None, timeout=30)
    out, _ = follow.communicate(timeout=30)
    assert follow.returncode == 1 and f"run killed (Slurm job {job} left the queue without starting: CANCELLED" in out, out
    assert " killed " in _ls(tmp_path / "runs", slurm.env)   # Slurm's word: not `lost`, not pending forever
    assert status(run_dir)["state"] == "pending"   # views only read: the status is recorded by a command that acts
    stop = _mt("stop", run_dir, env=slurm.env)
    st = json.loads((run_dir / "status.json").read_text())
    assert (st["state"], st["slurm_state"]) == ("killed", "CANCELLED"), (st, stop.stdout, stop.stderr)
    assert stop.returncode == 0 and "run killed (Slurm job" in stop.stdout, stop.stdout + stop.stderr


@pytest.mark.slow
def test_a_cancel_by_hand_is_a_graceful_stop_with_a_checkpoint_recorded_with_slurms_word(
        slurm: Cluster, tmp_path: Path) -> None:
    # the time-limit warning and a preemption requeue the job: tests/cluster/test_slurm_preempt.py
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 1},
                          train={"max_steps": 10_000, "warmup_steps": 1}, checkpoint={"every_steps": 10_000},
                          faults={"step_sleep_s": 0.05}, slurm={"signal_grace_s": 30})
    done = _mt("launch", preset, "--slurm", env=slurm.env)
    assert done.returncode == 0, done.stderr
    run_dir = run_dir_from(done.stdout)
    job = status(run_dir)["slurm_job_id"]
    slurm.wait_for("a few steps", lambda: len(events(run_dir, "step")) >= 3, timeout=60)
    slurm.run("scancel", job)   # TERM to every task (then KILL after KillWait); the job CANCELLED, not requeued
    final = slurm.wait_for("the run to end", lambda: status(run_dir)["state"] in
                           ("completed", "failed", "killed", "stopped") and status(run_dir), timeout=60)
    assert final["state"] == "stopped", (run_dir / "logs" / "supervisor.log").read_text()
    assert final["slurm_state"] == "CANCELLED" and final["reason"].startswith(f"CANCELLED in Slurm (job {job}, COMPLETING")
    saved = events(run_dir, "checkpoint")
    assert saved and saved[-1]["step"] == events(run_dir, "step")[-1]["step"]   # the stop's own checkpoint
    slurm.wait_for("the job to leave the queue", lambda: slurm.state(job) == "" or None, timeout=30)


@pytest.mark.slow
def test_a_script_of_the_users_own_runs_as_a_job_too(slurm: Cluster, tmp_path: Path) -> None:
    script = REPO / "tests" / "library" / "scripts" / "plain_loop.py"   # the mt library, no torch: fast
    done = _mt("launch", script, "--slurm", "--runs-dir", tmp_path / "runs", "--", "--steps", "12", "--sleep", "0.01",
               env=slurm.env)
    assert done.returncode == 0, done.stderr
    run_dir = run_dir_from(done.stdout)
    final = slurm.wait_for("the run to complete", lambda: status(run_dir)["state"] in
                           ("completed", "failed", "killed", "stopped") and status(run_dir), timeout=60)
    assert final["state"] == "completed", (run_dir / "logs" / "supervisor.log").read_text()
    assert [e["step"] for e in events(run_dir, "step")][-1] == 12


STOPPER = """
import sys, time
from mt.contract.inbox import StopSignals
s = StopSignals()
s.install()
print("ready", flush=True)
while s.received is None:
    time.sleep(0.01)
print("stopping", flush=True)
time.sleep(float(sys.argv[1]))
print("clean", flush=True)
"""


def test_a_repeated_sigterm_within_moments_is_the_same_stop_and_a_later_one_exits_at_once() -> None:
    # under Slurm a rank gets a cancel's SIGTERM twice (from Slurm, and forwarded): that must not end it hard
    for gap, rc, says in ((0.02, 0, "clean"), (1.0, 128 + signal.SIGTERM, "stopping")):
        proc = subprocess.Popen([sys.executable, "-c", STOPPER, "3"], cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            proc.send_signal(signal.SIGTERM)
            assert proc.stdout.readline().strip() == "stopping"
            time.sleep(gap)
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
        finally:
            proc.kill()
        assert proc.returncode == rc and (out.strip().splitlines() or ["stopping"])[-1] == says, (gap, proc.returncode, out)
