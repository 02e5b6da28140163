"""The job's one reader of nodes/ (tui/read/nodes.py JobReader) behind the supervisor's peer watch
and the rules, over a job's per-node layout written with the contract's writers (tests/tui/jobdir.py):
a crash on another node reaches the exit rule once, as that node's exit with its failed workers; each
node's status is read once a tick; every node's system samples reach the rules, so a stall on
node n2's rank is found and named with its node."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from mt.contract.config import MonitorConfig
from mt.contract.heartbeat import Heartbeat
from mt.contract.paths import RunPaths
from mt.contract.status import Status, read_status, write_status
from mt.contract.system import clean_sample
from tests.cli.conftest import mt
from tests.tui.jobdir import JobDir, two_nodes
from tui.cluster.peers import PeerNodes
from tui.diagnose.monitor import IncidentMonitor, Tick
from tui.read.nodes import JobReader, every_heartbeat
from tui.supervise.sampler import SystemSampler

pytestmark = pytest.mark.timeout(120)
LOG = logging.getLogger("test")
OPENS: list[str] = []   # what the audit hook below records while a test listens
_LISTEN: list[bool] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _LISTEN and event == "open" and isinstance(args[0], (str, Path)):
        OPENS.append(str(args[0]))


sys.addaudithook(_audit)   # never removable: it records only while a test listens


def _failed_n2(job: JobDir, failures: list[dict[str, Any]], attempt: int = 1) -> None:
    """n2's supervisor records its torchrun's failure and the workers that failed there (as supervisor.py does)."""
    st = read_status(job.paths.root, "n2")
    st.state, st.exit_code, st.attempt, st.failures = "failed", 1, attempt, failures
    st.attempts = [{"attempt": attempt, "started": time.time() - 5, "ended": time.time(), "exit_code": 1, "failures": failures}]
    write_status(job.paths.on("n2"), st, node_only=True)


def test_a_rank_killed_on_n2_is_one_crash_naming_the_node_rank_and_signal_from_n2s_record(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 5, gap_s=0.05)
    monitor = IncidentMonitor(tmp_path, MonitorConfig(), node="n1")
    monitor.poll()
    # kill -9 leaves nothing in rank 3's log: only n2's supervisor's record (torchrun's report) names it
    _failed_n2(job, [{"rank": 3, "exit_code": -9, "pid": 4242}, {"rank": 2, "exit_code": 1, "pid": 4241}])
    job.sample()
    crash = [r for r in monitor.poll() if r["code"] == "crash" and r["status"] == "open"]
    assert crash, "no crash incident"
    rec = crash[0]
    assert rec["title"] == "Worker crashed: rank 3 on node n2 at step 6", rec["title"]
    assert rec["detail"].startswith("rank 3 on node n2 was killed by SIGKILL"), rec["detail"]
    assert "then rank 2 on node n2 exit 1" in rec["detail"], rec["detail"]
    ev = rec["evidence"]
    assert (ev["rank"], ev["node"], ev["signal"], ev["exit_code"], ev["pid"]) == (3, "n2", "SIGKILL", -9, 4242), ev
    assert ev["failures"][:2] == [{"rank": 3, "exit_code": -9, "pid": 4242, "node": "n2"},
                                  {"rank": 2, "exit_code": 1, "pid": 4241, "node": "n2"}], ev["failures"]
    assert ev["torchrun_exit_code"] == 1   # n2's torchrun: the job's own status still says running
    job.close()


def test_a_node_that_started_the_next_attempt_keeps_its_failure_in_the_attempts_record(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 3)
    _failed_n2(job, [{"rank": 2, "exit_code": -9, "pid": 7}])
    st = read_status(tmp_path, "n2")
    st.state, st.attempt, st.exit_code, st.failures = "running", 2, None, []   # n2 went on to attempt 2
    st.attempts.append({"attempt": 2, "started": time.time(), "ended": None, "exit_code": None})
    write_status(job.paths.on("n2"), st, node_only=True)
    reader = JobReader(tmp_path)
    reader.poll()
    [gone] = reader.exits(1)
    assert (gone.node, gone.attempt, gone.exit_code) == ("n2", 1, 1)
    assert [(f.rank, f.exit_code, f.node) for f in gone.failures] == [(2, -9, "n2")]
    assert reader.exits(2) == [] and reader.exits(1, but="n2") == []
    assert PeerNodes(job.paths.on("n1"), reader, LOG).killed_elsewhere(1) == "rank 2 on node n2 was killed by signal 9 (SIGKILL)"
    job.close()


def test_the_peer_watch_and_the_rules_tick_read_each_nodes_status_once(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 5, gap_s=0.05)
    reader = JobReader(tmp_path)   # the supervisor's: its peer watch and its rules share it
    monitor = IncidentMonitor(tmp_path, MonitorConfig(), node="n1", job=reader)
    peers = PeerNodes(job.paths.on("n1"), reader, LOG)
    status = read_status(tmp_path)
    monitor.observe(Tick(time.time(), status))
    _failed_n2(job, [{"rank": 3, "exit_code": -9, "pid": 4242}])
    n2_status = str(job.paths.on("n2").node_status)
    OPENS.clear()
    _LISTEN.append(True)
    try:
        peers.wait_for_attempt_end(1, 5.0)   # the end of the job's attempt: n2 has recorded its end
        reason = peers.killed_elsewhere(1)
        out = monitor.observe(Tick(time.time(), status))   # the tick right after (supervisor.py _attempt)
    finally:
        _LISTEN.clear()
    assert OPENS.count(n2_status) == 1, OPENS
    assert reason == "rank 3 on node n2 was killed by signal 9 (SIGKILL)"
    crash = [r for r in out if r["code"] == "crash"]
    assert crash and crash[0]["title"].startswith("Worker crashed: rank 3 on node n2"), out
    job.close()


def test_every_nodes_samples_reach_the_rules_once_each_with_its_node(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 3)
    monitor = IncidentMonitor(tmp_path, MonitorConfig(), node="n1")
    own = {**job.templates["n1"], "t": time.time()}   # the job's node's sample comes in its tick
    monitor.observe(Tick(time.time(), read_status(tmp_path), samples=[clean_sample(own)]))
    job.sample()
    monitor.observe(Tick(time.time(), read_status(tmp_path)))
    monitor.observe(Tick(time.time(), read_status(tmp_path)))   # nothing new: nothing fed twice
    nodes = [s.get("node") for s in monitor.memory.system]
    # n1's file is its own (the tick carries them); n2's two samples (start, then one) from its tail
    assert sorted(nodes) == ["n1", "n2", "n2"], nodes
    assert monitor.memory.newest_system("n2")["ranks"][0]["rank"] == 2
    job.close()


def test_a_one_machine_runs_samples_stay_as_written(tmp_path: Path) -> None:
    sample = SystemSampler().sample({0: os.getpid()})
    assert set(clean_sample(sample)["ranks"][0]) == {"rank", "pid", "cpu_pct", "rss_bytes", "alive"}
    detailed = clean_sample(SystemSampler().sample({0: os.getpid()}, detail=True))["ranks"][0]
    assert detailed["syscall"] is not None and isinstance(detailed["workers"], list), detailed
    hostile = clean_sample({"t": time.time(), "ranks": [{"rank": 1, "syscall": 7, "workers": [{"pid": "x"}, 3, {"pid": 9, "state": []}]}]})
    assert hostile["ranks"] == [{"rank": 1, "pid": None, "cpu_pct": None, "rss_bytes": None, "alive": None, "syscall": None,
                                 "workers": [{"pid": 9, "state": None, "syscall": None, "cmdline": None}]}], hostile


RANK_WAITS = "import os; r, w = os.pipe(); os.read(r, 1)"   # blocked in read: waiting for its next batch
LOADER = "import time; time.sleep(120)"


@pytest.fixture
def ranks() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Rank 0 (n1) waiting in a collective, rank 1 (n2) waiting on its input while its DataLoader worker works."""
    feeding = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {LOADER!r}]); {RANK_WAITS}"
    procs = {"r0": subprocess.Popen([sys.executable, "-c", RANK_WAITS]),
             "r1": subprocess.Popen([sys.executable, "-c", feeding])}
    try:
        yield procs
    finally:
        for p in procs.values():
            for child in _children(p.pid):
                os.kill(child, 9)
            p.kill()
            p.wait()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_stall_on_node_n2s_rank_is_found_from_n2s_samples_and_named_with_its_node(
        tmp_path: Path, ranks: dict[str, subprocess.Popen[bytes]]) -> None:
    job = JobDir(tmp_path, ["n1", "n2"], 1)
    job.start(pids={0: ranks["r0"].pid, 1: ranks["r1"].pid}, sampled=False)
    st = read_status(tmp_path)   # the job's supervisor's own ranks, as it records them
    st.worker_pids = {"0": ranks["r0"].pid}
    write_status(job.paths.on("n1"), st)
    for s in range(1, 8):   # past warm-up, then no step: both ranks wait
        job.step(s)
        time.sleep(0.05)
    deadline = time.monotonic() + 20
    while not _children(ranks["r1"].pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    monitor = IncidentMonitor(tmp_path, MonitorConfig(hang_floor_s=60.0), node="n1")
    sampler = SystemSampler()   # n2's supervisor's: its ranks' system calls and workers, it is not the job's node
    rec = None
    while rec is None and time.monotonic() < deadline:
        sampler.append({1: ranks["r1"].pid}, job.paths.on("n2").system, LOG, detail=True)
        rec = next((r for r in monitor.poll() if r["code"] == "dataloader_stall"), None)
        time.sleep(0.5)
    assert rec is not None, "no dataloader_stall incident"
    assert rec["title"] == "Dataloader stall at step 8" and rec["evidence"]["in_progress"], rec
    assert "rank 1 on node n2: waits in read, worker " in rec["detail"], rec["detail"]
    assert sorted(rec["evidence"]["ranks"]) == ["0", "1"], rec["evidence"]   # n1's rank read in /proc, n2's from its sample
    job.close()


def test_a_nodes_lists_of_ranks_are_cut_to_what_the_job_holds(tmp_path: Path) -> None:
    """n2's status names 50,000 workers and 1,000 failures, a sample and a heartbeat name ranks outside the
    job's world: the reader keeps n2's nproc (2) of the job's 4 ranks, and the rules see no more."""
    job = two_nodes(tmp_path, 3)
    st = read_status(tmp_path, "n2")
    st.worker_pids = {str(r): 1000 + r for r in range(50_000)}
    st.state, st.exit_code = "failed", 1
    # 1,000 failures beside them: the file stays under the door's 1 MiB (a larger one is refused whole)
    st.failures = [{"rank": r, "exit_code": 1, "pid": 1000 + r} for r in range(1_000, 0, -1)]
    st.attempts = [{"attempt": 1, "exit_code": 1, "failures": st.failures}]
    write_status(job.paths.on("n2"), st, node_only=True)
    tmpl = job.templates["n2"]
    job.templates["n2"] = {**tmpl, "ranks": [*tmpl["ranks"], *({**tmpl["ranks"][0], "rank": r} for r in (4, 7, 900))]}
    job.sample()
    outside = job.paths.on("n2").heartbeat(9)   # rank 9 of a 4-rank job
    outside.write_text(json.dumps({"step": 3, "t": time.time(), "rank": 9, "attempt": 1}))
    reader = JobReader(tmp_path)
    n1, n2 = reader.poll()
    assert n2.status.worker_pids == {"0": 1000, "1": 1001}, len(n2.status.worker_pids)
    assert [f["rank"] for f in n2.status.failures] == [3, 2], len(n2.status.failures)   # root cause first, as recorded
    assert [f["rank"] for f in n2.status.attempts[0]["failures"]] == [3, 2]
    assert [e["rank"] for e in n2.sample["ranks"]] == [2, 3], n2.sample["ranks"]
    assert sorted(n2.heartbeats) == [2, 3] and max(r.rank for r in n2.ranks()) == 3
    [gone] = reader.exits(1)
    assert [f.rank for f in gone.failures] == [3, 2]
    job.close()


def test_a_nodes_link_is_never_followed(tmp_path: Path) -> None:
    """`nodes` a link to /proc (its pid folders look like node names) or to a real job's nodes: no node is read."""
    job = two_nodes(tmp_path / "real", 3)
    job.close()
    for target in (Path("/proc"), job.paths.nodes_dir):
        root = tmp_path / f"via-{target.name}"
        JobDir(root, ["n1", "n2"], 2).close()
        write_status(RunPaths(root), Status(state="running", attempt=1))   # no node list, no nnodes: only the link is refused
        os.symlink(target, root / "nodes")
        assert RunPaths(root).node_names() == [] and JobReader(root).poll() == [], target
        out = mt("watch", "--once", str(root))
        assert out.returncode == 0 and "job:" not in out.stdout, out.stdout


def test_a_folder_that_is_not_the_jobs_node_is_not_read(tmp_path: Path) -> None:
    job = two_nodes(tmp_path, 3)
    stray = job.paths.on("n3")
    write_status(stray, Status(state="running", attempt=1, worker_pids={"2": os.getpid()}), node_only=True)
    Heartbeat(stray.heartbeat(2), 2, 1).beat(10**5)   # it would lead the job's rank 2 by far
    reader = JobReader(tmp_path)
    assert [v.name for v in reader.poll()] == ["n1", "n2"] and reader.strays == ["n3"]
    assert every_heartbeat(job.paths)[2]["step"] == 3
    job.close()
