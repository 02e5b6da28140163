"""Time limits, preemption, requeue and control of a Slurm run on the real test cluster (issue #24
tests 2, 3 and 6): the stop's checkpoint, the job requeued, a second attempt resuming from it to
the same weights as an uninterrupted run; `mt stop` and `mt kill` from outside the allocation.

A requeued job waits for its BeginTime before it is eligible again (cred_expire here, about two
minutes on a default Slurm): the tests shorten that with `scontrol update JobId=.. StartTime=now`."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mt.contract.records import parse_event
from mt.contract.status import Status
from tests.cli.conftest import MT, REPO, events, run_dir_from, status, write_preset
from tests.cluster.conftest import Cluster
from tests.engine.runner import final_weights, steps_by_attempt
from tui.cluster.preempt import CheckpointLag, Ending, JobInfo, after_stop, cut_short, restart_count

FINAL = ("completed", "failed", "killed", "stopped")
HARD = {"model": {"dropout": 0.1}, "train": {"grad_accum_steps": 2}}   # dropout and accumulation: state to restore


def _mt(*args: Any, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MT, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**env, "PYTHONUNBUFFERED": "1"})


def _preset(tmp_path: Path, nproc: int, steps: int, sleep: float = 0.1, every: int = 10) -> Path:
    return write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": nproc},
                        train={"max_steps": steps, "warmup_steps": 1, **HARD["train"]}, model=HARD["model"],
                        checkpoint={"every_steps": every}, faults={"step_sleep_s": sleep},
                        slurm={"signal_grace_s": 30})


def _submit(slurm: Cluster, what: Path, *args: Any) -> tuple[Path, str]:
    done = _mt("launch", what, "--slurm", *args, env=slurm.env)
    assert done.returncode == 0, done.stderr
    run_dir = run_dir_from(done.stdout)
    return run_dir, status(run_dir)["slurm_job_id"]


def _log(run_dir: Path) -> str:
    logs = sorted(run_dir.glob("**/supervisor.log")) + sorted((run_dir / "slurm").glob("job-*.out"))
    return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)


def _final(slurm: Cluster, run_dir: Path, timeout: float = 120) -> dict[str, Any]:
    return slurm.wait_for("the run to end", lambda: status(run_dir).get("state") in FINAL and status(run_dir),
                          timeout=timeout)


def _start_requeued(slurm: Cluster, job: str) -> None:
    """The requeued job back in the queue, made eligible in 2 s (instead of at its BeginTime; not
    `now`: a relaunch in the second of the requeue is refused, docs/slurm-testing.md)."""
    slurm.wait_for("the job to be pending again", lambda: slurm.state(job).startswith("PENDING"), timeout=60)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now+2")


def _gone(slurm: Cluster, job: str) -> None:
    slurm.wait_for("the job to leave the queue", lambda: slurm.state(job) == "" or None, timeout=60)


def _live(pid: int) -> bool:
    """The process runs (a zombie is over: it only waits for its parent to read its exit)."""
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    except OSError:
        return False


def _job_processes(slurm: Cluster, job: str) -> list[int]:
    """Every process of the job on any node: all nodes of the test cluster are this machine, and
    a job's processes carry its SLURM_JOB_ID and this cluster's SLURM_CONF (escaped ones too)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if _live(int(proc.name)) and f"SLURM_JOB_ID={job}".encode() in env and f"SLURM_CONF={slurm.conf}".encode() in env:
            found.append(int(proc.name))
    return found


def test_the_batch_script_asks_for_requeue_and_appends_every_attempts_output(tmp_path: Path) -> None:
    done = _mt("launch", _preset(tmp_path, 1, 5), "--slurm", "--dry-run", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert {"#SBATCH --requeue", "#SBATCH --open-mode=append"} <= set(done.stdout.splitlines())


def _records(*raw: dict[str, Any]) -> list[Any]:
    return [parse_event({"v": 1, "t": 1.8e9 + i, **r}) for i, r in enumerate(raw)]


def test_a_cut_short_attempt_counts_the_steps_since_the_newest_checkpoint() -> None:
    progress = CheckpointLag()
    seen = list(progress.feed(_records({"kind": "step", "step": 5}, {"kind": "checkpoint", "step": 5, "path": "c5",
                                                                          "reason": "interval"},
                                       {"kind": "step", "step": 6}, {"kind": "step", "step": 9})))
    assert len(seen) == 4 and (progress.step, progress.checkpoint, progress.lost) == (9, 5, 4)
    attempt = [{"attempt": 1, "started": 1.0, "ended": None}]
    lost = cut_short(Status(state="stopping", attempt=1, attempts=attempt), progress, "42")
    assert lost is not None and lost.code == "stop_cut_short" and lost.evidence["lost_steps"] == 4
    assert lost.title.startswith("4 steps lost") and "stop's checkpoint had not landed" in lost.detail
    # an attempt that recorded its own end (requeued after its checkpoint, or final) lost nothing
    for state in ("pending", "stopped", "completed"):
        assert cut_short(Status(state=state, attempt=1, attempts=attempt), progress, "42") is None
    assert CheckpointLag().lost == 0
    # the job's supervisor had said a node failed (it was killed with its tasks before its stop ended)
    said = "node n2 failed (NODE_FAIL): Slurm requeued job 42 (restart 1); this node's part is stopping"
    lost = cut_short(Status(state="stopping", attempt=1, attempts=attempt, slurm_state="NODE_FAIL", reason=said), progress, "42")
    assert lost is not None and f"(it was stopping: its stop's checkpoint had not landed; {said}): 4 steps lost" in lost.detail


def test_mt_stop_is_never_a_preemption_and_slurms_words_are_kept() -> None:
    # SIGINT (mt stop of a bare script, mt watch --headless) or a control request: stopped, Slurm not asked
    for sig in (None, signal.SIGINT):
        assert after_stop("42", sig, CheckpointLag(), "stop requested") == Ending("stopped", "stop requested")
    assert JobInfo("NODE_FAIL", "NodeDown", "0:0").words() == "NODE_FAIL (reason NodeDown)"
    assert JobInfo("COMPLETING", "None", "0:15").words() == "COMPLETING (exit 0:15)"
    assert (restart_count({"SLURM_RESTART_COUNT": "2"}), restart_count({}), restart_count({"SLURM_RESTART_COUNT": "x"})) == (2, 0, 0)
    st = Status.parse({"state": "stopped", "slurm_job_id": "42", "slurm_state": "CANCELLED"})
    assert st.slurm_state == "CANCELLED" and st.to_dict()["slurm_state"] == "CANCELLED"
    assert "slurm_state" not in Status(state="running").to_dict()


@pytest.mark.slow
@pytest.mark.parametrize(("how", "nproc"), [("time-limit-warning", 2), ("sigterm", 1)])
def test_a_preemption_checkpoints_requeues_and_the_next_attempt_ends_bitwise_equal(
        slurm: Cluster, tmp_path: Path, how: str, nproc: int) -> None:
    steps = 30
    preset = _preset(tmp_path, nproc, steps)
    # the same preset, uninterrupted and outside Slurm, beside it (the job's environment: the same threads)
    ref_runs = tmp_path / "ref"
    reference = subprocess.Popen([*MT, "launch", str(preset), "--headless", "--runs-dir", str(ref_runs)],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env={**slurm.env, "PYTHONUNBUFFERED": "1"})
    run_dir, job = _submit(slurm, preset)
    slurm.wait_for("steps past the first checkpoint", lambda: len(events(run_dir, "step")) >= 13, timeout=120)
    sent = time.time()
    if how == "time-limit-warning":   # what --signal=B:USR1@N delivers: USR1 to the batch shell only
        slurm.run("scancel", "--signal=USR1", "--batch", job)
    else:                             # a preemption's SIGTERM to every task of the job
        slurm.run("scancel", "--signal=TERM", job)
    st = slurm.wait_for("the run to be requeued", lambda: status(run_dir).get("state") == "pending"
                        and status(run_dir).get("slurm_state") == "REQUEUED" and status(run_dir), timeout=60)
    stop_ckpt = events(run_dir, "checkpoint")[-1]
    first = steps_by_attempt(run_dir)[1]
    assert stop_ckpt["reason"] == "stop" and stop_ckpt["step"] == first[-1]["step"] > 10, _log(run_dir)
    print(f"\n{how}: signal to checkpoint on disk {stop_ckpt['t'] - sent:.2f} s "
          f"(the checkpoint's own write {stop_ckpt['seconds']:.3f} s)")
    assert "preempted" in st["reason"] and f"step {stop_ckpt['step']}" in st["reason"]
    _start_requeued(slurm, job)
    final = _final(slurm, run_dir)
    assert final["state"] == "completed", _log(run_dir)
    assert [a["attempt"] for a in final["attempts"]] == [1, 2]
    assert [a.get("slurm_restart") for a in final["attempts"]] == [0, 1]
    start2 = [e for e in events(run_dir, "run_start") if e["attempt"] == 2][0]
    assert start2["start_step"] == stop_ckpt["step"] and start2["resumed_from"]["exact"] is True
    assert [s["step"] for s in steps_by_attempt(run_dir)[2]] == list(range(stop_ckpt["step"] + 1, steps + 1))
    out, _ = reference.communicate(timeout=240)
    assert reference.returncode == 0, out
    a, b = final_weights(run_dir_from(out)), final_weights(run_dir)
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    _gone(slurm, job)
    assert (run_dir / "slurm" / f"job-{job}.out").is_file()


@pytest.mark.slow
def test_a_library_script_stops_saves_requeues_and_resumes_from_its_own_checkpoint(
        slurm: Cluster, tmp_path: Path) -> None:
    script = REPO / "tests" / "library" / "scripts" / "plain_loop.py"   # ctl.stop -> its own checkpoint file
    run_dir, job = _submit(slurm, script, "--runs-dir", tmp_path / "runs", "--", "--steps", "60", "--sleep", "0.05")
    slurm.wait_for("a few steps", lambda: len(events(run_dir, "step")) >= 10, timeout=60)
    slurm.run("scancel", "--signal=TERM", job)
    slurm.wait_for("the run to be requeued", lambda: status(run_dir).get("state") == "pending", timeout=60)
    saved = events(run_dir, "checkpoint")[-1]
    stopped_at = steps_by_attempt(run_dir)[1][-1]["step"]
    assert saved["step"] == stopped_at and Path(saved["path"]).name == f"ckpt-{stopped_at}.json", _log(run_dir)
    _start_requeued(slurm, job)
    final = _final(slurm, run_dir)
    assert final["state"] == "completed", _log(run_dir)
    # run.resume_from in attempt 2 named the stop's checkpoint: the script went on from there
    assert [s["step"] for s in steps_by_attempt(run_dir)[2]] == list(range(stopped_at + 1, 61))
    _gone(slurm, job)


@pytest.mark.slow
def test_mt_stop_from_outside_the_allocation_ends_the_job_unrequeued_and_mt_resume_submits_it_again(
        slurm: Cluster, tmp_path: Path) -> None:
    run_dir, job = _submit(slurm, _preset(tmp_path, 1, 40, sleep=0.1, every=10_000))
    slurm.wait_for("a few steps", lambda: len(events(run_dir, "step")) >= 3, timeout=60)
    outside = {k: v for k, v in slurm.env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    done = _mt("stop", run_dir, env=outside)
    assert done.returncode == 0, done.stdout + done.stderr
    final = _final(slurm, run_dir, timeout=60)
    assert final["state"] == "stopped" and "slurm_state" not in final, _log(run_dir)
    stopped_at = events(run_dir, "step")[-1]["step"]
    assert events(run_dir, "checkpoint")[-1]["step"] == stopped_at < 40
    _gone(slurm, job)
    shown = slurm.run("scontrol", "show", "job", job, check=False).stdout
    assert "Restarts=0" in shown or not shown   # not requeued (or already forgotten: MinJobAge)
    # mt resume: the same run directory, a new job, a second attempt from the stop's checkpoint
    done = _mt("resume", run_dir, env=outside)
    assert done.returncode == 0, done.stdout + done.stderr
    again = status(run_dir)["slurm_job_id"]
    assert again != job and f"slurm job: {again}" in done.stdout
    final = _final(slurm, run_dir)
    assert final["state"] == "completed" and [a["attempt"] for a in final["attempts"]] == [1, 2], _log(run_dir)
    assert [s["step"] for s in steps_by_attempt(run_dir)[2]] == list(range(stopped_at + 1, 41))
    _gone(slurm, again)


@pytest.mark.slow
def test_mt_kill_cancels_the_job_and_leaves_no_process_on_any_node(slurm: Cluster, tmp_path: Path) -> None:
    run_dir, job = _submit(slurm, _preset(tmp_path, 2, 10_000, sleep=0.05, every=10_000))
    slurm.wait_for("both ranks stepping", lambda: len(status(run_dir).get("worker_pids", {})) == 2
                   and len(events(run_dir, "step")) >= 2, timeout=90)
    pids = _job_processes(slurm, job)
    assert len(pids) >= 4   # at least the batch shell, the supervisor, torchrun and two ranks
    done = _mt("kill", run_dir, env=slurm.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Slurm job {job} cancelled" in done.stdout
    # Slurm ended every process: nothing was left here, and the line says so (not "0 process(es) terminated")
    assert done.stdout.startswith(f"killed: no process left to terminate here (Slurm ended the processes of job {job})"), done.stdout
    # cancelled in Slurm (not a job that ended because its processes did), and kept so for MinJobAge
    assert "JobState=CANCELLED" in slurm.run("scontrol", "show", "job", job).stdout
    assert status(run_dir)["state"] == "killed"
    assert not events(run_dir, "checkpoint")   # a kill is no stop: no rank saved (every=10_000: none due)
    _gone(slurm, job)
    slurm.wait_for("no process of the job left", lambda: not _job_processes(slurm, job), timeout=30)
    alive = [p for p in pids if _live(p)]
    assert not alive, [Path(f"/proc/{p}/cmdline").read_bytes() for p in alive]
    time.sleep(2)
    assert slurm.state(job) == "" and status(run_dir)["state"] == "killed"   # not requeued either


@pytest.mark.slow
def test_an_attempt_slurm_ends_before_the_stop_checkpoint_is_an_incident_with_the_steps_lost(
        slurm: Cluster, tmp_path: Path) -> None:
    run_dir, job = _submit(slurm, _preset(tmp_path, 1, 24, sleep=0.1, every=5))
    slurm.wait_for("steps past a checkpoint", lambda: len(events(run_dir, "step")) >= 8, timeout=90)
    (worker,) = status(run_dir)["worker_pids"].values()
    os.kill(worker, signal.SIGSTOP)   # a checkpoint that takes longer than the grace period: it never lands
    slurm.run("scancel", "--signal=TERM", job)
    slurm.wait_for("the stop to be under way", lambda: status(run_dir).get("state") == "stopping", timeout=30)
    last, ckpt = events(run_dir, "step")[-1]["step"], events(run_dir, "checkpoint")[-1]["step"]
    # the end of the grace period: SIGKILL to every process of the job at once (done here, since
    # Slurm's own kill sends SIGCONT first and the rank would save), then the job back in the queue
    # as a preemption with PreemptMode=REQUEUE does
    for pid in _job_processes(slurm, job):
        os.kill(pid, signal.SIGKILL)
    slurm.wait_for("the job to be over", lambda: not slurm.state(job).startswith("RUNNING"), timeout=30)
    slurm.run("scontrol", "requeue", job)
    _start_requeued(slurm, job)
    final = _final(slurm, run_dir)
    assert final["state"] == "completed", _log(run_dir)
    lost = [i for i in _incidents(run_dir) if i["code"] == "stop_cut_short"]
    assert [i["status"] for i in lost] == ["open", "closed"], _incidents(run_dir)
    assert lost[0]["evidence"]["lost_steps"] == last - ckpt > 0 and lost[0]["evidence"]["checkpoint_step"] == ckpt
    assert f"{last - ckpt} steps lost" in lost[0]["title"] and "grace period was too short" in lost[0]["detail"]
    assert steps_by_attempt(run_dir)[2][0]["step"] == ckpt + 1


@pytest.mark.slow
def test_a_job_that_ends_with_its_supervisor_and_no_requeue_is_recorded_failed_with_the_steps_lost(
        slurm: Cluster, tmp_path: Path) -> None:
    run_dir, job = _submit(slurm, _preset(tmp_path, 1, 10_000, sleep=0.1, every=5))
    slurm.wait_for("steps past a checkpoint", lambda: len(events(run_dir, "step")) >= 8, timeout=90)
    for pid in _job_processes(slurm, job):   # the time limit's or a failed node's end: all at once, no stop
        os.kill(pid, signal.SIGKILL)
    _gone(slurm, job)
    last, ckpt = events(run_dir, "step")[-1]["step"], events(run_dir, "checkpoint")[-1]["step"]
    assert status(run_dir)["state"] == "running"
    once = _mt("watch", run_dir, "--once", env=slurm.env)
    assert once.returncode == 0, once.stderr
    assert "lost" not in once.stdout.split("\n")[0] and "[lost]" not in once.stdout, once.stdout
    assert f"Slurm job {job} ended (" in once.stdout and f"{last - ckpt} steps lost" in once.stdout, once.stdout
    assert status(run_dir)["state"] == "running"   # views only read: a command that acts records it
    stop = _mt("stop", run_dir, env=slurm.env)
    st = status(run_dir)
    assert st["state"] == "failed" and st["reason"].startswith(f"Slurm job {job} ended ("), (st, stop.stdout, stop.stderr)
    assert f"{last - ckpt} steps lost since the newest checkpoint, at step {ckpt}" in st["reason"]
    assert stop.returncode == 0 and "run failed (Slurm job" in stop.stdout, stop.stdout + stop.stderr


def _incidents(run_dir: Path) -> list[dict[str, Any]]:
    import json

    path = run_dir / "incidents.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
