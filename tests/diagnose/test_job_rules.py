"""The rules over every node of a job's shared run directory (real files, real time): a hang,
a straggler and a crash name the rank and its node; one-machine wording is unchanged."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from mt.contract.config import MonitorConfig
from mt.contract.status import Status, write_status
from tests.tui.jobdir import JobDir, two_nodes
from tui.diagnose.lost import LOST_QUIET_S
from tui.diagnose.monitor import IncidentMonitor, Tick
from tui.format.fmt import fmt_ranks

pytestmark = pytest.mark.timeout(120)


def poll_until(monitor: IncidentMonitor, job: JobDir, code: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.sample()
        for rec in monitor.poll():
            if rec["code"] == code and rec["status"] == "open":
                return rec
        time.sleep(0.3)
    raise AssertionError(f"no {code} incident")


def test_a_stale_heartbeat_on_node_n2_is_a_hang_naming_rank_3_and_n2(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 10, gap_s=0.05)
    job.step(11, ranks=[0, 1, 2])      # rank 3 (on n2) never finishes step 11; the others wait for it
    monitor = IncidentMonitor(tmp_path, MonitorConfig(hang_floor_s=1.0, hang_step_factor=2.0))
    t0 = time.monotonic()
    rec = poll_until(monitor, job, "hang")
    assert time.monotonic() - t0 >= 1.0
    assert rec["title"] == "Hang: rank 3 on node n2 stopped at step 10", rec["title"]
    assert "rank 3 on node n2 looks stuck (its heartbeat is behind (step 10))" in rec["detail"], rec["detail"]
    assert "rank 0 on node n1: heartbeat step 11" in rec["detail"]
    assert rec["evidence"]["suspect_ranks"] == [3] and rec["evidence"]["ranks"]["3"]["node"] == "n2"
    job.close()


def test_a_rank_behind_on_its_node_is_a_straggler_naming_the_node(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 3, gap_s=0.05)
    monitor = IncidentMonitor(tmp_path, MonitorConfig(straggler_steps=5, hang_floor_s=60.0))
    deadline = time.monotonic() + 20
    step, rec = 3, None
    while rec is None and time.monotonic() < deadline:
        step += 1
        job.step(step, ranks=[0, 1, 3])   # rank 2 on n2 beats at step 3 only
        job.sample()
        rec = next((r for r in monitor.poll() if r["code"] == "straggler"), None)
        time.sleep(0.2)
    assert rec is not None, "no straggler incident"
    assert rec["title"] == "Straggler: rank 2 on node n2 behind", rec["title"]
    assert rec["detail"].startswith("rank 2 on node n2 is "), rec["detail"]
    job.close()


def test_a_rank_that_died_on_node_n2_is_a_crash_naming_rank_3_and_n2(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 5, gap_s=0.05)
    monitor = IncidentMonitor(tmp_path, MonitorConfig())
    monitor.poll()
    job.log(3, "Traceback (most recent call last):\n  File \"train.py\", line 9\nRuntimeError: CUDA error: an illegal memory access\n")
    job.sample(alive={3: False})
    # n2's supervisor records its torchrun's exit; the job's status (n1's supervisor) still says running
    write_status(job.paths.on("n2"), Status(state="failed", attempt=1, exit_code=1, nnodes=2, node_rank=1,
                                                 reason="torchrun exited with 1"), node_only=True)
    rec = poll_until(monitor, job, "crash", timeout=10)
    assert rec["title"] == "Worker crashed: rank 3 on node n2 at step 6", rec["title"]
    assert rec["detail"].startswith("rank 3 on node n2 raised RuntimeError: CUDA error"), rec["detail"]
    assert rec["evidence"]["node"] == "n2" and rec["evidence"]["torchrun_exit_code"] == 1
    job.close()


def test_a_node_failure_of_an_earlier_attempt_is_not_a_crash_of_this_one(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 5, gap_s=0.05)
    write_status(job.paths.on("n2"), Status(state="failed", attempt=0, exit_code=1, nnodes=2, node_rank=1), node_only=True)
    monitor = IncidentMonitor(tmp_path, MonitorConfig())
    for _ in range(3):
        job.sample()
        assert not [r for r in monitor.poll() if r["code"] in ("crash", "oom", "nccl_timeout")]
        time.sleep(0.3)
    job.close()


# What the engine prints on a rank whose collective lost its peer (engine/dist.py report_failure,
# the traceback into the rank log) and what NCCL's watchdog prints when a peer never joins.
GLOO_PEER = ("Traceback (most recent call last):\n  File \"engine/train.py\", line 140, in train\n"
             "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.12]:40321\n")
NCCL_WATCHDOG = ("[rank0]:[E1202 13:40:01.123 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
                 "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1000, NumelOut=1000, Timeout(ms)=5000) "
                 "ran for 5011 milliseconds before timing out.\n")


def _n2_goes_away(tmp_path: Path, error: str) -> tuple[JobDir, IncidentMonitor]:
    """A 2-node job whose node n2 went away after step 5 (its ranks' heartbeats and its supervisor's
    samples stop, its status keeps what it last said); n1's ranks then fail in their next collective,
    rank 0 writing run_end, and n1's supervisor records the job failed (job-level status)."""
    job = two_nodes(tmp_path, 5, gap_s=0.05)
    monitor = IncidentMonitor(tmp_path, MonitorConfig(), node="n1")
    monitor.poll()
    time.sleep(0.3)
    job.step(6, ranks=[0, 1])          # n1's ranks take one more step; n2 is gone
    job.sample(nodes=["n1"])
    for r in (0, 1):
        job.log(r, error)
    job.event("run_end", step=6, status="failed", reason="rank 0: " + error.strip().splitlines()[-1])
    st = Status(state="failed", attempt=1, exit_code=1, nnodes=2, nproc=2, node_rank=0, reason="torchrun exited with 1")
    write_status(job.paths, st)
    return job, monitor


def _quiet_for(monitor: IncidentMonitor, job: JobDir, seconds: float) -> list[dict]:
    """Poll while n2 stays quiet `seconds` (n1's supervisor sampling on): the exit incidents opened."""
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        job.sample(nodes=["n1"])
        out += [r for r in monitor.poll() if r["code"] in ("crash", "oom", "nccl_timeout") and r["status"] == "open"]
        time.sleep(0.3)
    return out


def _exits(monitor: IncidentMonitor, job: JobDir, sampling: tuple[str, ...] = ("n1",)) -> list[dict]:
    out = []
    for _ in range(3):
        job.sample(nodes=list(sampling))
        out += [r for r in monitor.poll() if r["code"] in ("crash", "oom", "nccl_timeout") and r["status"] == "open"]
        time.sleep(0.2)
    return out


def test_a_lost_node_is_the_incident_and_the_survivors_lost_peer_its_consequence(tmp_path: Path) -> None:
    job, monitor = _n2_goes_away(tmp_path, GLOO_PEER)
    # n2 maybe lost: its supervisor may yet record a failed worker; nothing blames rank 0 on n1 meanwhile
    assert _quiet_for(monitor, job, LOST_QUIET_S - 2.0) == []
    time.sleep(2.0)
    [rec] = _exits(monitor, job)   # one incident: none blames rank 0 on n1
    assert rec["code"] == "crash" and rec["title"] == "Node lost: node n2 (ranks 2, 3) at step 6", rec["title"]
    assert rec["detail"].startswith("node n2 stopped first: its heartbeats ended at step 5, "), rec["detail"]
    assert "(status running)" in rec["detail"], rec["detail"]
    assert ("rank 0 on node n1 then lost its collective peer: RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
            "pair.cc:534] Connection closed by peer") in rec["detail"], rec["detail"]
    ev = rec["evidence"]
    assert (ev["rank"], ev["node"]) == (2, "n2"), ev
    [lost] = ev["lost_nodes"]
    assert (lost["node"], lost["ranks"], lost["last_heartbeat_step"], lost["state"]) == ("n2", [2, 3], 5, "running"), lost
    assert lost["quiet_before_others_s"] > 0, lost
    assert (ev["survivor"]["rank"], ev["survivor"]["node"], ev["survivor"]["kind"]) == (0, "n1", "peer"), ev["survivor"]
    job.close()


def test_a_lost_node_with_no_status_left_is_named_over_an_nccl_watchdog_timeout(tmp_path: Path) -> None:
    job, monitor = _n2_goes_away(tmp_path, NCCL_WATCHDOG)
    job.paths.on("n2").node_status.unlink()   # nothing: its supervisor never wrote, or its disk went with it
    time.sleep(LOST_QUIET_S)
    [rec] = _exits(monitor, job)
    assert rec["code"] == "crash" and rec["title"] == "Node lost: node n2 (ranks 2, 3) at step 6", rec["title"]
    assert "(no status)" in rec["detail"] and "rank 0 on node n1 then timed out in a collective: " in rec["detail"], rec["detail"]
    assert rec["evidence"]["survivor"]["kind"] == "timeout"
    job.close()


def test_every_node_losing_its_peer_alike_is_still_a_collective_timeout(tmp_path: Path) -> None:
    """A network failure: n2's ranks log the lost peer too and its supervisor still samples, so no node is lost."""
    job, monitor = _n2_goes_away(tmp_path, GLOO_PEER)
    for r in (2, 3):
        job.log(r, GLOO_PEER)
    job.sample()
    [rec] = _exits(monitor, job)
    assert rec["code"] == "nccl_timeout" and rec["title"].startswith("Collective timeout at step 7: rank 0 on node n1 gave up waiting"), rec
    job.close()


def test_a_silent_node_whose_supervisor_still_samples_is_not_lost(tmp_path: Path) -> None:
    """n2's ranks hung (their heartbeats stop, their logs say nothing) but n2's supervisor lives:
    rank 0's watchdog timeout stays a collective timeout, no node is called lost."""
    job, monitor = _n2_goes_away(tmp_path, NCCL_WATCHDOG)
    [rec] = _exits(monitor, job, sampling=("n1", "n2"))
    assert rec["code"] == "nccl_timeout" and "lost_nodes" not in rec["evidence"], rec
    job.close()


def test_a_lost_nodes_ranks_read_as_ranges_in_its_title() -> None:
    assert (fmt_ranks([1]), fmt_ranks([2, 3]), fmt_ranks(list(range(8, 16)))) == ("rank 1", "ranks 2, 3", "ranks 8-15")
    assert fmt_ranks([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7, 8"


def test_a_rank_killed_on_a_live_node_is_the_crash_its_supervisor_records_not_a_lost_node(tmp_path: Path) -> None:
    """kill -9 of n2's rank 3: n1's ranks lose their peer at once, n2's supervisor samples on and
    records the failed worker a moment later; the one exit incident is that crash."""
    job, monitor = _n2_goes_away(tmp_path, GLOO_PEER)
    out = []
    for _ in range(4):
        job.sample(alive={3: False})   # n2's supervisor lives: its samples go on while its torchrun reports
        out += [r for r in monitor.poll() if r["status"] == "open" and r["code"] in ("crash", "oom", "nccl_timeout")]
        time.sleep(0.3)
    st = Status(state="failed", attempt=1, exit_code=1, nnodes=2, nproc=2, node_rank=1, reason="torchrun exited with 1",
                failures=[{"rank": 3, "exit_code": -9, "pid": 4242}])
    write_status(job.paths.on("n2"), st, node_only=True)
    out += _exits(monitor, job)
    assert [r["title"] for r in out] == ["Worker crashed: rank 3 on node n2 at step 7"], out
    job.close()


# Step anatomies as the engine wrote them on a real 2-rank CPU run (tests/diagnose/test_rules_slowrank.py):
# a rank whose dataset sleeps 10 ms an item, and its peer waiting for it in all-reduce
WAITS = {"step_s": 0.09036, "data_s": 0.0007804, "compute_s": 0.002731, "optim_s": 0.0009271, "comm_s": 0.08554}
SLOW_INPUT = {"step_s": 0.09053, "data_s": 0.08346, "compute_s": 0.003233, "optim_s": 0.0009633, "comm_s": 0.002394}


def test_a_slow_input_rank_on_n2_is_a_straggler_naming_its_node(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 3, gap_s=0.05)
    job.anatomy({r: SLOW_INPUT if r == 3 else WAITS for r in range(4)})
    monitor = IncidentMonitor(tmp_path, MonitorConfig(hang_floor_s=60.0))
    deadline = time.monotonic() + 20
    step, rec = 3, None
    while rec is None and time.monotonic() < deadline:
        step += 1
        job.step(step)
        job.sample()
        rec = next((r for r in monitor.poll() if r["code"] == "straggler"), None)
        time.sleep(0.1)
    assert rec is not None, "no straggler incident"
    assert rec["title"] == "Straggler: rank 3 on node n2 is input-bound", rec["title"]
    assert rec["evidence"]["why"].startswith("rank 3 on node n2 is input-bound: it waits 83 ms a step for data while "
                                             "rank 0 on node n1, 1 on node n1, 2 on node n2 wait ~86 ms"), rec["evidence"]
    assert (rec["evidence"]["rank"], rec["evidence"]["node"]) == (3, "n2"), rec["evidence"]
    job.close()


def test_a_node_folder_that_is_not_the_jobs_makes_no_incident(tmp_path: Path) -> None:
    """nodes/n3, not one of the job's nodes, says a worker of it was killed: the healthy job has no incident."""
    job = two_nodes(tmp_path, 3, gap_s=0.05)
    stray = job.paths.on("n3")
    stray.here.mkdir(parents=True)
    write_status(stray, Status(state="failed", attempt=1, exit_code=1, nnodes=2, nproc=2, node_rank=2,
                               failures=[{"rank": 7, "exit_code": -9, "pid": 4242}]), node_only=True)
    monitor = IncidentMonitor(tmp_path, MonitorConfig(hang_floor_s=60.0))
    out = []
    for step in range(4, 10):   # the job steps on: each tick reads every node the job has
        job.step(step)
        job.sample()
        out += monitor.poll()
        time.sleep(0.05)
    assert out == [], out
    assert [v.name for v in monitor.job.views] == ["n1", "n2"] and monitor.job.strays == ["n3"]
    job.close()


def test_a_heartbeat_past_max_steps_is_no_progress_and_no_straggler(tmp_path: Path) -> None:
    """Rank 3's heartbeat says step 1e18 (the job runs 10**6 steps): no rank is taken to lag behind it."""
    job = two_nodes(tmp_path, 3, gap_s=0.05)
    job.beats[3]._map[:] = (json.dumps({"step": 1e18, "t": time.time(), "pid": os.getpid(), "rank": 3, "attempt": 1,
                                        "phase": "train"}).ljust(job.beats[3].WIDTH) + "\n").encode()
    monitor = IncidentMonitor(tmp_path, MonitorConfig(straggler_steps=5, hang_floor_s=60.0))
    monitor.poll()
    assert monitor.memory.heartbeat_lag == {}, monitor.memory.heartbeat_lag   # what the straggler rule judges: no lag at all
    assert 3 not in monitor.job.views[1].heartbeats
    # the rule's own window: a lag must hold max(3 s, 3 x the median step interval) before it is a straggler
    steady = max(3.0, 3 * (monitor.memory.median_step_interval() or 1.0))
    t0, step, out = time.monotonic(), 3, []
    while time.monotonic() - t0 < 1.5 * steady:
        step += 1
        job.step(step, ranks=[0, 1, 2])
        job.sample()
        out += [r for r in monitor.poll() if r["code"] == "straggler"]
        time.sleep(0.1)
    assert out == [], out


NODE_FAIL_SAID = "node n2 failed (NODE_FAIL): Slurm requeued job 7 (restart 1); this node's part is stopping"
SLURM_TERM = "Signal 15 (SIGTERM) received by PID 4242\n"


def _as_n1s_supervisor(monitor: IncidentMonitor, job: JobDir, st: Status) -> list[dict]:
    """Ticks as n1's supervisor runs them (tui/supervise/supervisor.py): its status and its own sample in
    memory, the other nodes' from their files; the exit incidents opened."""
    out = []
    for _ in range(3):
        sample = {**job.templates["n1"], "t": time.time()}
        recs = monitor.observe(Tick(time.time(), st, monitor.events.iter_new(), [sample]))
        out += [r for r in recs if r["code"] in ("crash", "oom", "nccl_timeout") and r["status"] == "open"]
        time.sleep(0.2)
    return out


@pytest.mark.parametrize("order", ["slurm first, survivors silent", "slurm first, survivors stopped by its SIGTERM",
                                   "survivors lost their peer, then slurm"])
def test_slurms_node_fail_names_the_lost_node_at_once_whichever_came_first(tmp_path: Path, order: str) -> None:
    """Slurm's NODE_FAIL (its SIGTERM to n1, recorded in the job's status), n2's death and n1's ranks'
    errors arrive in any order, and Slurm kills n1's supervisor KillWait (2 s on the test cluster) after
    its SIGTERM: the one exit incident names n2 as soon as Slurm said it, well before LOST_QUIET_S."""
    job = two_nodes(tmp_path, 5, gap_s=0.05)
    monitor = IncidentMonitor(tmp_path, MonitorConfig(), node="n1")
    base = dict(attempt=1, nnodes=2, nproc=2, node_rank=0)
    _as_n1s_supervisor(monitor, job, Status(state="running", **base))
    time.sleep(0.3)   # n2 goes: its heartbeats and samples stop; n1's supervisor samples on
    if order.startswith("survivors lost"):
        for r in (0, 1):
            job.log(r, GLOO_PEER)
        # maybe lost: not yet a verdict, and nothing blames n1
        assert _as_n1s_supervisor(monitor, job, Status(state="running", **base)) == []
    elif order.endswith("SIGTERM"):
        for r in (0, 1):
            job.log(r, SLURM_TERM)
    t0 = time.monotonic()
    out = _as_n1s_supervisor(monitor, job, Status(state="stopping", slurm_state="NODE_FAIL", reason=NODE_FAIL_SAID, **base))
    took = time.monotonic() - t0
    assert [r["title"] for r in out] == ["Node lost: node n2 (ranks 2, 3) at step 6"], out
    assert took < LOST_QUIET_S - 2.0, took
    ev = out[0]["evidence"]
    assert (ev["node"], ev["survivor"]["node"], ev["survivor"]["rank"]) == ("n2", "n1", 0), ev
    job.close()
