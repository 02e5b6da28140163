"""`mt stacks` on jobs started by plain `torchrun`: `--pid` for a script that calls nothing from mt,
the run directory a script's own `mt.init` made, and one run directory two torchrun nodes share."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mt.contract.jsonl import write_json_atomic
from mt.contract.paths import ENV_NODE, RunPaths
from mt.contract.status import Status
from tests.cli.conftest import MT, REPO, mt, wait_for
from tui.stacks.auto import IncidentCaptures, detail_of, evidence_of
from tui.stacks.capture import NoRanksError, py_spy, ranks_of_pid
from tui.stacks.text import verdict_note

pytestmark = [pytest.mark.slow, pytest.mark.skipif(py_spy() is None, reason="py-spy reads a script without mt")]
SCRIPT = REPO / "tests" / "library" / "scripts" / "faulty.py"
LINES = SCRIPT.read_text().splitlines()
HANG_LINE = next(i for i, line in enumerate(LINES, 1) if "time.sleep(1.0)" in line)
REDUCE_LINE = next(i for i, line in enumerate(LINES, 1) if "dist.all_reduce(t)" in line)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(cwd: Path, *args: str, nnodes: int = 1, node_rank: int = 0, port: int | None = None,
              nproc: int = 2, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Plain torchrun (no mt launch) over faulty.py; its output goes to cwd/torchrun<node_rank>.log."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--nnodes", str(nnodes),
           "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port or _port()),
           str(SCRIPT), "--fault", "hang", "--steps", "400", *args]
    log = open(cwd / f"torchrun{node_rank}.log", "wb")
    return subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _end(proc: subprocess.Popen[bytes]) -> None:
    """The agent and every process under it: torchrun starts each rank in a process group of its own,
    so the agent's group alone left the hung ranks running after the suite (adopted by init)."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(30)
    psutil.wait_procs(tree, timeout=30)


def _stacks(*args: str) -> list[str] | None:
    out = mt("stacks", *args, timeout=60)
    return out.stdout.splitlines() if out.returncode == 0 else None


def test_stacks_pid_names_the_stuck_rank_of_a_torchrun_job_without_mt(tmp_path):
    job = _torchrun(tmp_path, "--no-mt", "--rank", "1", "--at", "3")
    want = f"rank 1 is in `<module>` (faulty.py:{HANG_LINE}); rank 0 waits in `all_reduce` (faulty.py:{REDUCE_LINE})"
    try:
        lines = wait_for(lambda: (got := _stacks("--pid", str(job.pid))) and got[0] == want and got, 120,
                         "rank 1 in its hang", every=1.0)
        assert lines[1].startswith(f"  rank 1: <module> (faulty.py:{HANG_LINE})  [py-spy]"), lines
        assert lines[-1].startswith("kept nowhere"), lines
        worker = next(p for p in psutil.Process(job.pid).children() if p.environ().get("RANK") == "0")
        out = mt("stacks", "--pid", worker.pid, "--out", tmp_path / "caps", "--all", timeout=60)
        assert out.returncode == 0 and out.stdout.splitlines()[0] == want, out.stderr
        (folder,) = (tmp_path / "caps").iterdir()
        kept = json.loads((folder / "verdict.json").read_text())
        assert kept["line"] == want and sorted(kept["ranks"]) == ["0", "1"]
        assert (folder / "rank1.txt").read_text().startswith("Process ")
        assert "main thread:" in out.stdout
    finally:
        _end(job)
    bad = mt("stacks", "--pid", os.getpid())
    assert bad.returncode == 2 and bad.stderr.startswith(f"mt: pid {os.getpid()}: not a torchrun agent"), bad.stderr
    assert mt("stacks").returncode == 2 and mt("stacks", tmp_path, "--out", tmp_path).returncode == 2


def test_stacks_reads_the_run_directory_a_scripts_own_mt_init_made_under_torchrun(tmp_path):
    job = _torchrun(tmp_path, "--rank", "1", "--at", "3")
    want = f"rank 1 is in `<module>` (faulty.py:{HANG_LINE}); rank 0 waits in `all_reduce` (faulty.py:{REDUCE_LINE})"
    try:
        run = wait_for(lambda: next((p for p in (tmp_path / "runs").glob("*/status.json")), None), 120, "mt.init's run").parent
        lines = wait_for(lambda: (got := _stacks(str(run))) and got[0] == want and got, 120, "rank 1 in its hang", every=1.0)
        assert lines[-1].startswith(f"kept in {run / 'stacks'}"), lines
        assert "no rank log to read a SIGUSR2 dump from" in (mt("stacks", run, "--all").stdout)
    finally:
        _end(job)


def _ranks(pid: int) -> dict[int, psutil.Process]:
    try:
        return ranks_of_pid(pid)
    except NoRanksError:  # torchrun has not started them yet
        return {}


def _node_run(tmp_path: Path, nodes: dict[str, int]) -> Path:
    """One shared run directory with a supervisor's status for each node, naming that node's torchrun agent."""
    run = tmp_path / "job"
    (run / "control").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    for node, agent in nodes.items():
        paths = RunPaths(run, node)
        paths.here.mkdir(parents=True)
        write_json_atomic(paths.node_status, Status(state="running", attempt=1, torchrun_pid=agent).to_dict())
    return run


def test_each_nodes_supervisor_answers_a_request_and_the_verdict_groups_ranks_across_nodes(tmp_path):
    port = _port()
    jobs = [_torchrun(tmp_path, "--no-mt", "--rank", "3", "--at", "3", "--run-dir", str(tmp_path / "job"),
                      nnodes=2, node_rank=k, port=port, env={ENV_NODE: f"n{k + 1}"}) for k in (0, 1)]
    run = _node_run(tmp_path, {"n1": jobs[0].pid, "n2": jobs[1].pid})
    log = logging.getLogger("test")
    sups = {n: IncidentCaptures(run, log, wait_s=0.5, node=n, nodes_wait_s=30) for n in ("n1", "n2")}
    for sup in sups.values():
        sup.since -= 5   # a request the viewer makes right away still counts
    want = (f"rank 3 is in `<module>` (faulty.py:{HANG_LINE}); ranks 0, 1, 2 wait in `all_reduce` "
            f"(faulty.py:{REDUCE_LINE})")

    def viewer() -> list[str] | None:
        """`mt stacks RUN` while both nodes' supervisors tick (here: this test's loop)."""
        ask = subprocess.Popen([*MT, "stacks", str(run), "--timeout", "30"], stdout=subprocess.PIPE, text=True)
        while ask.poll() is None:
            for sup in sups.values():
                sup.take()
            time.sleep(0.1)
        lines = ask.stdout.read().splitlines() if ask.stdout else []
        return lines if ask.returncode == 0 and lines and lines[0] == want else None

    try:
        wait_for(lambda: all(len(_ranks(j.pid)) == 2 for j in jobs), 120, "both nodes' ranks")
        lines = wait_for(viewer, 180, "rank 3 in its hang, seen across nodes", every=0.5)
        assert lines[1] == f"  rank 3: <module> (faulty.py:{HANG_LINE})  [node n2]", lines
        assert lines[2] == f"  ranks 0, 1, 2: <module> (faulty.py:{REDUCE_LINE}) -> all_reduce  [node n1, n2]", lines
        assert sum(1 for line in lines if line.startswith("node n")) == 2
        for n in ("n1", "n2"):
            folder = max((run / "nodes" / n / "stacks").iterdir())
            kept = json.loads((folder / "verdict.json").read_text())
            assert sorted(kept["ranks"]) == (["0", "1"] if n == "n1" else ["2", "3"]) and kept["request"]

        sups["n1"].opened("hang")  # n1's incident: it asks n2 too, and its verdict holds every node's ranks
        done = wait_for(lambda: sups["n2"].take() or sups["n1"].take(), 60, "n1's capture for its hang", every=0.1)
        (got,) = done
        assert got.nodes is not None and got.nodes.verdict.line == want and got.nodes.silent == ()
        assert verdict_note(got.nodes) == f"stacks: {want} (2 nodes)"   # the dashboard's `p` on a job
        ev = evidence_of(got.capture, run, got.nodes)
        assert ev["verdict"] == want and ev["groups"][0] == {"ranks": [3], "nodes": ["n2"], "func": "<module>",
                                                             "where": f"faulty.py:{HANG_LINE}", "waits_in": None}
        assert sorted(ev["node_stacks"]) == ["n1", "n2"] and detail_of(got.capture, got.nodes) == f"stacks: {want}"
    finally:
        for job in jobs:
            _end(job)
