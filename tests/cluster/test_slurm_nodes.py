"""A Slurm job of two nodes (n1, n2 of the test cluster), one rank per node on CPU (gloo), in one
shared run directory: each node's supervisor writes under nodes/<node>/, the job's (n1) the top.

Issue #24 tests 1 (the job completes; both nodes' samples and heartbeats meanwhile), 4 (rank 1
killed on n2: a crash incident naming the node and the rank) and 5 (a held job reads `pending`)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from mt.contract.config import Config, LaunchConfig, MonitorConfig, RunConfig
from mt.contract.paths import ENV_NODE, RunPaths
from mt.contract.status import Status, read_status, write_status
from tests.cli.conftest import MT, REPO, events, run_dir_from, status, write_preset
from tests.cluster.conftest import Cluster
from tui.diagnose.exit import worker_exit
from tui.diagnose.findings import Observation
from tui.diagnose.memory import RuleMemory, RunFacts
from tui.read.nodes import NodeExit
from tui.read.procs import run_processes
from tui.read.torchrun_log import Failure
from tui.supervise.torchrun import NodeRole, torchrun_command, worker_env

FINAL = ("completed", "failed", "killed", "stopped")


def _mt(*args: object, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MT, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**env, "PYTHONUNBUFFERED": "1"})


def _preset(tmp_path: Path, steps: int, sleep_s: float, **over: Any) -> Path:
    return write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 1, "nnodes": 2, **over},
                        train={"max_steps": steps, "warmup_steps": 1}, checkpoint={"every_steps": 1000},
                        faults={"step_sleep_s": sleep_s}, slurm={"time": "0:05:00"})


def _submit(slurm: Cluster, preset: Path) -> tuple[Path, str]:
    done = _mt("launch", preset, "--slurm", env=slurm.env)
    assert done.returncode == 0, done.stderr
    run_dir = run_dir_from(done.stdout)
    return run_dir, status(run_dir)["slurm_job_id"]


def test_a_rank_finds_its_nodes_folder_in_mt_node_and_a_bad_value_is_the_top(tmp_path: Path) -> None:
    assert RunPaths.of_process(tmp_path, {ENV_NODE: "n2"}).heartbeat(1) == tmp_path / "nodes" / "n2" / "heartbeat" / "rank1"
    assert RunPaths.of_process(tmp_path, {ENV_NODE: "n2"}).events == tmp_path / "events.jsonl"
    for bad in ("", "..", "a/b"):
        assert RunPaths.of_process(tmp_path, {ENV_NODE: bad}).node is None


def test_each_node_names_the_rendezvous_host_and_passes_its_node_to_the_ranks(tmp_path: Path) -> None:
    cfg = Config(RunConfig(name="t"), launch=LaunchConfig(nnodes=2, nproc_per_node=1, rdzv_endpoint="127.0.0.1:20042"))
    cmd = torchrun_command(cfg, tmp_path, 1, node=NodeRole(is_host=False, addr="127.0.0.1"))
    at = cmd.index("--rdzv-conf")
    assert cmd[at:at + 4] == ["--rdzv-conf", "is_host=false", "--local-addr", "127.0.0.1"], cmd
    assert "--rdzv-conf" not in torchrun_command(cfg, tmp_path, 1)   # by hand (--node-rank K): as before
    assert worker_env(cfg, base={ENV_NODE: "stale"}, node="n2")[ENV_NODE] == "n2"
    assert ENV_NODE not in worker_env(cfg, base={ENV_NODE: "stale"})


def test_a_node_that_is_not_the_jobs_writes_only_its_own_status(tmp_path: Path) -> None:
    st = Status(state="failed", attempt=1, node="n2", failures=[{"rank": 1, "exit_code": -9, "pid": 7}])
    write_status(RunPaths(tmp_path, "n2"), st, node_only=True)
    assert not (tmp_path / "status.json").exists()
    back = read_status(tmp_path, "n2")
    assert (back.node, back.failures, back.state) == ("n2", [{"rank": 1, "exit_code": -9, "pid": 7}], "failed")
    write_status(RunPaths(tmp_path, "n1"), Status(state="running", node="n1"))   # the job's: both files
    assert read_status(tmp_path).node == "n1" and read_status(tmp_path, "n1").state == "running"
    assert Status.parse({"node": "../x", "failures": "no"}).invalid == {"node", "failures"}


REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_10:00:00
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 55)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_the_crash_names_the_other_nodes_rank_killed_by_a_signal_not_the_one_that_lost_it() -> None:
    obs = Observation(0.0, Status(state="failed", exit_code=1, attempt=1), torchrun_log=REPORT, node="n1",
                      rank_logs={0: "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5"},
                      node_exits={"n2": NodeExit("n2", 1, 1, "failed", [Failure(1, -9, 77, node="n2")])})
    found = worker_exit(RuleMemory(RunFacts(world_size=2)), obs, MonitorConfig())
    assert found is not None and found.code == "crash", found
    assert found.title.startswith("Worker crashed: rank 1 on node n2"), found.title
    assert found.detail.startswith("rank 1 on node n2 was killed by SIGKILL") and "rank 0 on node n1 exit 1" in found.detail
    assert (found.evidence["rank"], found.evidence["node"], found.evidence["signal"]) == (1, "n2", "SIGKILL")


def test_a_nodes_processes_are_told_apart_by_their_node(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    code = "import time; time.sleep(30)"
    procs = [subprocess.Popen([*MT[:1], "-c", code, "--run-dir", str(run)], env={**os.environ, ENV_NODE: n}) for n in ("n1", "n2")]
    try:
        psutil.wait_procs([], timeout=0)
        mine = {p.pid for p in run_processes(run, node="n2")}
        assert mine == {procs[1].pid}, mine
        assert {p.pid for p in run_processes(run)} >= {procs[0].pid, procs[1].pid}
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_dry_run_of_two_nodes_asks_for_both_without_a_rendezvous_in_the_preset(tmp_path: Path) -> None:
    done = _mt("launch", _preset(tmp_path, steps=5, sleep_s=0), "--slurm", "--dry-run", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=2" in done.stdout.splitlines() and "#SBATCH --ntasks-per-node=1" in done.stdout.splitlines()
    by_hand = _mt("launch", _preset(tmp_path, steps=5, sleep_s=0), "--detach", env=dict(os.environ))
    assert by_hand.returncode == 2 and "launch.rdzv_endpoint: required when launch.nnodes > 1" in by_hand.stderr


def _node_status(run_dir: Path, node: str) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "nodes" / node / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def _logs(run_dir: Path) -> str:
    return "\n".join(f"--- {p.relative_to(run_dir)}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(run_dir.glob("nodes/*/logs/*.log")) + sorted((run_dir / "slurm").glob("*.out")))


def _leftovers(run_dir: Path) -> list[str]:
    """Processes of this run still there (on this machine: both test nodes)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and str(run_dir) in " ".join(p.info["cmdline"] or []):
            out.append(f"{p.pid} {' '.join(p.info['cmdline'])}")
    return out


def _final(slurm: Cluster, run_dir: Path, job: str, timeout: float = 180) -> dict[str, Any]:
    final = slurm.wait_for("the job to end", lambda: status(run_dir).get("state") in FINAL and status(run_dir),
                           timeout=timeout, every=0.5)
    slurm.wait_for("the job to leave the queue", lambda: slurm.state(job) == "" or None, timeout=60)
    slurm.wait_for("no process of the run left", lambda: not _leftovers(run_dir), timeout=30)
    return final


@pytest.mark.slow
def test_a_two_node_job_completes_with_each_nodes_files_in_its_folder(slurm: Cluster, tmp_path: Path) -> None:
    run_dir, job = _submit(slurm, _preset(tmp_path, steps=40, sleep_s=0.15))
    nodes = run_dir / "nodes"
    # during the run: both nodes' system samples and both ranks' heartbeats, each in its node's folder
    slurm.wait_for("samples and heartbeats of both nodes", lambda: all(
        len(_lines(nodes / n / "system.jsonl")) >= 2 and any((nodes / n / "heartbeat").glob("rank*"))
        for n in ("n1", "n2")), timeout=120, every=0.5)
    beats = {n: sorted(p.name for p in (nodes / n / "heartbeat").iterdir()) for n in ("n1", "n2")}
    assert sorted(beats["n1"] + beats["n2"]) == ["rank0", "rank1"], beats
    assert beats["n1"] == ["rank0"], beats   # the job's node starts first: rank 0 (docs/run-directory.md)
    n2 = _node_status(run_dir, "n2")
    assert n2["node"] == "n2" and n2["slurm_job_id"] == job and list(n2["worker_pids"]) == ["1"], n2
    slurm.wait_for("a few steps", lambda: len(events(run_dir, "step")) >= 3, timeout=60)
    once = _mt("watch", run_dir, "--once", env=slurm.env)
    assert once.returncode == 0, once.stderr
    assert "[running]" in once.stdout and "world 2 x cpu" in once.stdout, once.stdout
    # one view of the job: both nodes, each with its rank (the one reader of nodes/, tui/read/nodes.py)
    shown = [" ".join(line.split()) for line in once.stdout.splitlines()]
    assert "job: 2 nodes, 2 ranks" in shown, once.stdout
    at = {line.split()[0]: k for k, line in enumerate(shown) if line.split()[:2] in (["n1", "running"], ["n2", "running"])}
    assert set(at) == {"n1", "n2"}, once.stdout
    assert shown[at["n1"] + 1].startswith("r0 step ") and shown[at["n2"] + 1].startswith("r1 step "), once.stdout
    final = _final(slurm, run_dir, job)
    assert final["state"] == "completed", _logs(run_dir)
    assert [e["step"] for e in events(run_dir, "step")] == list(range(1, 41))
    assert events(run_dir, "run_start")[0]["world_size"] == 2
    assert final["slurm_job_id"] == job and final["nnodes"] == 2 and final["node"] == "n1"
    assert final["job_nodes"] == ["n1", "n2"], final   # Slurm's list: the only folders under nodes/ its readers count
    assert _node_status(run_dir, "n2")["state"] == "completed"
    # the one-machine files stay away from the top; the job's files stay there
    assert not (run_dir / "system.jsonl").exists() and not list((run_dir / "heartbeat").glob("*"))
    assert not (run_dir / "logs" / "supervisor.log").exists()
    for n, rank in (("n1", 0), ("n2", 1)):
        assert (nodes / n / "logs" / f"rank{rank}.log").is_file() and (nodes / n / "logs" / "supervisor.log").is_file()
        assert f"node {n} (node rank {rank} of 2)" in (nodes / n / "logs" / "supervisor.log").read_text()
    assert (run_dir / "events.jsonl").is_file() and (run_dir / "status.json").is_file()
    header, row = _ls_row(tmp_path / "runs", slurm.env)
    assert " completed " in row and header.split()[-1] == "SLURM" and f"  {job} " in row, row


def _incidents(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _lines(run_dir / "incidents.jsonl")]


@pytest.mark.slow
def test_a_rank_killed_on_n2_fails_the_job_with_a_crash_naming_the_node_and_rank(slurm: Cluster, tmp_path: Path) -> None:
    run_dir, job = _submit(slurm, _preset(tmp_path, steps=10_000, sleep_s=0.1, max_restarts=0))
    slurm.wait_for("a few steps", lambda: len(events(run_dir, "step")) >= 3, timeout=120, every=0.5)
    pids = slurm.wait_for("n2's worker pid", lambda: _node_status(run_dir, "n2").get("worker_pids"), timeout=30)
    assert list(pids) == ["1"], pids
    os.kill(pids["1"], signal.SIGKILL)   # what the OOM killer (or kill -9 on that node) does
    final = _final(slurm, run_dir, job)
    assert final["state"] == "failed", _logs(run_dir)
    assert final["reason"].startswith("rank 1 on node n2 was killed by signal 9 (SIGKILL)"), final["reason"]
    n2 = _node_status(run_dir, "n2")
    assert n2["state"] == "failed" and n2["failures"][0]["rank"] == 1 and n2["failures"][0]["exit_code"] == -9, n2
    crash = [i for i in _incidents(run_dir) if i["code"] == "crash" and i["status"] == "open"]
    assert crash, _incidents(run_dir)
    assert crash[0]["title"].startswith("Worker crashed: rank 1 on node n2"), crash[0]
    assert crash[0]["evidence"]["rank"] == 1 and crash[0]["evidence"]["node"] == "n2", crash[0]
    assert "SIGKILL" in crash[0]["detail"], crash[0]
    assert not (run_dir / "nodes" / "n2" / "incidents.jsonl").exists()   # one writer: the job's supervisor


def _ls_row(runs: Path, env: dict[str, str]) -> tuple[str, str]:
    done = _mt("ls", runs, env=env)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[:2]
    return header, row


@pytest.mark.slow
def test_a_held_job_shows_pending_with_slurms_reason_in_ls_and_watch(slurm: Cluster, tmp_path: Path) -> None:
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 1, "nnodes": 2},
                          slurm={"extra": ["--begin=now+600"]})   # queued long enough to be held by hand
    run_dir, job = _submit(slurm, preset)
    try:
        slurm.run("scontrol", "hold", job)
        slurm.wait_for("the hold", lambda: "JobHeld" in slurm.state(job), timeout=30)
        header, row = _ls_row(tmp_path / "runs", slurm.env)
        assert header.split()[-1] == "SLURM" and " pending " in row, row
        assert row.endswith(f"{job} PENDING (JobHeldAdmin)") or row.endswith(f"{job} PENDING (JobHeldUser)"), row
        once = _mt("watch", run_dir, "--once", env=slurm.env)
        assert once.returncode == 0, once.stderr
        assert "[pending]" in once.stdout and f"pending: Slurm job {job} PENDING (JobHeld" in once.stdout, once.stdout
        # no Slurm tools here (a laptop reading a copied run directory): what status.json says
        bare = {**slurm.env, "PATH": str(Path(os.__file__).parent)}
        _, row = _ls_row(tmp_path / "runs", bare)
        assert row.endswith(f"{job} pending"), row
        once = _mt("watch", run_dir, "--once", env=bare)
        assert once.returncode == 0 and f"pending: Slurm job {job} (squeue not available" in once.stdout, once.stdout
    finally:
        slurm.run("scancel", job, check=False)
    slurm.wait_for("the job to leave the queue", lambda: slurm.state(job) == "" or None, timeout=30)
    assert status(run_dir)["state"] == "pending" and not (run_dir / "nodes").exists()   # it never started


@pytest.mark.slow
def test_with_a_restart_left_both_nodes_start_the_next_attempt_and_the_job_completes(slurm: Cluster, tmp_path: Path) -> None:
    run_dir, job = _submit(slurm, _preset(tmp_path, steps=25, sleep_s=0.1, max_restarts=1))
    slurm.wait_for("a few steps", lambda: len(events(run_dir, "step")) >= 3, timeout=120, every=0.5)
    pids = slurm.wait_for("n2's worker pid", lambda: _node_status(run_dir, "n2").get("worker_pids"), timeout=30)
    os.kill(pids["1"], signal.SIGKILL)
    final = _final(slurm, run_dir, job)
    assert final["state"] == "completed" and final["attempt"] == 2, _logs(run_dir)
    assert [e["attempt"] for e in events(run_dir, "run_start")] == [1, 2]
    n2 = _node_status(run_dir, "n2")
    assert (n2["state"], n2["attempt"]) == ("completed", 2), n2
    crash = [i for i in _incidents(run_dir) if i["code"] == "crash" and i["status"] == "open"]
    assert crash and crash[0]["title"].startswith("Worker crashed: rank 1 on node n2"), _incidents(run_dir)


@pytest.mark.slow
def test_a_node_lost_mid_run_is_recorded_as_its_node_fail_and_the_requeued_job_goes_on(slurm: Cluster, tmp_path: Path) -> None:
    """NODE_FAIL: n2 goes down (`scontrol update state=down`, as slurmctld marks a node that stopped
    answering) and its supervisor and rank die with it, writing nothing more. Slurm requeues the job
    itself (--requeue, JobRequeue=1) and SIGTERMs n1's tasks: the job's supervisor says the node failed
    at once (KillWait may end it before its stop does), and the requeued job runs the next attempt."""
    run_dir, job = _submit(slurm, _preset(tmp_path, steps=10_000, sleep_s=0.1, max_restarts=0))
    try:
        slurm.wait_for("a few steps", lambda: len(events(run_dir, "step")) >= 3, timeout=120, every=0.5)
        n2 = slurm.wait_for("n2's worker pid", lambda: _node_status(run_dir, "n2").get("worker_pids") and
                            _node_status(run_dir, "n2"), timeout=30)
        slurm.run("scontrol", "update", "nodename=n2", "state=down", "reason=mt-test-lost")
        for pid in (n2["supervisor_pid"], *n2["worker_pids"].values()):   # the node's processes go with it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        said = slurm.wait_for("the job's supervisor to record the node failure",
                              lambda: status(run_dir).get("slurm_state") == "NODE_FAIL" and status(run_dir),
                              timeout=60, every=0.2)
        assert said["state"] in ("stopping", "pending"), said   # pending: its stop ended before Slurm's SIGKILL
        assert said["reason"].startswith(f"node n2 failed (NODE_FAIL): Slurm requeued job {job} (restart 1)"), said["reason"]
        assert _node_status(run_dir, "n2")["attempt"] == 1 and _node_status(run_dir, "n2")["state"] == "running"   # n2 wrote nothing more
        # the requeued job (n2 back: ReturnToService=2) runs the next attempt on both nodes
        slurm.wait_for("the requeued job's next attempt", lambda: len(events(run_dir, "run_start")) >= 2, timeout=180, every=0.5)
        assert status(run_dir)["attempt"] == 2
        # attempt 1's end: recorded `pending` by its supervisor, or (Slurm killed it first) the next attempt's
        # stop_cut_short says it, with Slurm's NODE_FAIL either way
        lost = [i for i in _incidents(run_dir) if i["code"] == "stop_cut_short"]
        recorded = 'state pending {"reason":"node n2 failed (NODE_FAIL)' in (run_dir / "nodes/n1/logs/supervisor.log").read_text()
        assert recorded or (lost and "node n2 failed (NODE_FAIL)" in lost[0]["detail"]), _incidents(run_dir)
        # n1's rank lost its peer in its next all-reduce: the one exit incident names the lost node, not n1's rank
        exits = [i for i in _incidents(run_dir) if i["code"] in ("crash", "oom", "nccl_timeout") and i["status"] == "open"]
        assert len(exits) == 1 and exits[0]["title"].startswith("Node lost: node n2 (rank 1) at step "), _incidents(run_dir)
        assert (exits[0]["evidence"]["node"], exits[0]["evidence"]["rank"]) == ("n2", 1), exits
        assert exits[0]["evidence"]["survivor"]["node"] == "n1", exits
    finally:
        slurm.run("scancel", job, check=False)
        slurm.run("scontrol", "update", "nodename=n2", "state=resume", check=False)   # ReturnToService=2 may have already
    slurm.wait_for("the job to leave the queue", lambda: slurm.state(job) == "" or None, timeout=60)
    slurm.wait_for("no process of the run left", lambda: not _leftovers(run_dir), timeout=30)
    slurm.wait_for("both nodes idle again", lambda: "n2 idle" in slurm.run("sinfo", "-h", "-N", "-o", "%N %t").stdout or None,
                   timeout=60)
