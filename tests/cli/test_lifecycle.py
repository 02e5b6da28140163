"""End to end with the real engine: launch, watch, ckpt, stop, resume, ls, auto-resume, multi-node."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from tests.cli.conftest import MT, REPO, events, mt, run_dir_from, status, wait_for, write_preset

pytestmark = pytest.mark.slow


def test_detach_watch_ckpt_stop_resume_ls(tmp_path: Path, runs: Path) -> None:
    # slowed down so there is time to talk to it while it runs
    # a hang aimed at rank 1 (never reached: stopped long before) must not block resuming on 1 rank
    preset = write_preset(tmp_path / "p.toml", runs, train={"max_steps": 40},
                          checkpoint={"every_steps": 0}, faults={"step_sleep_s": 0.1, "hang_rank": 1, "hang_at_step": 40})
    res = mt("launch", preset, "--detach", "--name", "flow")
    assert res.returncode == 0, res.stderr
    run_dir = Path(res.stdout.strip())
    assert run_dir.parent == runs and run_dir.name.startswith("flow-")
    wait_for(lambda: events(run_dir, "step"), 180, "the first step")
    # the supervisor lives in its own session, not ours: a closed terminal or a quit viewer
    # (SIGHUP/SIGINT to our session or process group) never reaches it
    sup = status(run_dir)["supervisor_pid"]
    assert os.getsid(sup) != os.getsid(0) and os.getpgid(sup) != os.getpgid(0)

    once = mt("watch", run_dir, "--once")
    assert once.returncode == 0, once.stderr
    assert "[running]" in once.stdout and "attempt 1" in once.stdout and "/40" in once.stdout

    ck = mt("ckpt", run_dir, "--timeout", "60")
    assert ck.returncode == 0, ck.stdout + ck.stderr
    saved = [e for e in events(run_dir, "checkpoint") if e.get("reason") == "request"]
    assert len(saved) == 1 and ck.stdout.strip() == f"checkpoint saved at step {saved[0]['step']}: {saved[0]['path']}"
    assert Path(saved[0]["path"]).is_dir()

    stop = mt("stop", run_dir, "--timeout", "120")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    st = status(run_dir)
    assert st["state"] == "stopped"
    final = events(run_dir, "checkpoint")[-1]
    assert final["reason"] in ("stop", "final", "request") and final["step"] < 40
    assert f"step {final['step']}" in stop.stdout

    again = mt("stop", run_dir)
    assert again.returncode == 2 and "already ended (stopped)" in again.stderr

    # resume on another world size: the engine keeps the global batch (grad_accum doubles)
    resumed = mt("resume", run_dir, "--headless", "--nproc", "1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # only attempt 2's lines: attempt 1's start and end are not replayed
    assert "attempt 1 started" not in resumed.stdout and "attempt 2 started" in resumed.stdout
    assert ": stopped (" not in resumed.stdout, resumed.stdout
    assert status(run_dir)["state"] == "completed" and status(run_dir)["attempt"] == 2
    starts = events(run_dir, "run_start")
    assert [s["attempt"] for s in starts] == [1, 2] and starts[1]["start_step"] == final["step"]
    assert [s["world_size"] for s in starts] == [2, 1]
    assert starts[0]["effective_batch"] == starts[1]["effective_batch"]
    cfg = json.loads((run_dir / "config.json").read_text())  # says what attempt 2 ran with
    assert cfg["launch"]["nproc_per_node"] == 1 and cfg["train"]["grad_accum_steps"] == 2
    assert cfg["faults"]["hang_at_step"] == 0
    assert list((run_dir / "logs").glob("rank*.log")), "no worker logs"

    ls = mt("ls", runs)
    assert ls.returncode == 0
    row = next(l for l in ls.stdout.splitlines() if l.startswith(run_dir.name))
    assert "completed" in row and "40/40" in row


def test_injected_crash_auto_resumes_or_fails(tmp_path: Path, runs: Path, two_node_job: object) -> None:
    # two runs at once (their start-ups overlap): one may restart once, the other may not
    resumes = write_preset(tmp_path / "a.toml", runs, launch={"max_restarts": 1}, train={"max_steps": 16},
                           faults={"crash_at_step": 12, "crash_rank": 1})
    fails = write_preset(tmp_path / "b.toml", runs, train={"max_steps": 6, "warmup_steps": 0},
                         launch={"nproc_per_node": 1}, faults={"crash_at_step": 2, "crash_rank": 0})
    procs = [subprocess.Popen([*MT, "launch", str(p), "--headless"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO) for p in (resumes, fails)]
    (out_a, err_a), (out_b, err_b) = (p.communicate(timeout=300) for p in procs)

    assert procs[0].returncode == 0, out_a + err_a
    run_dir = run_dir_from(out_a)
    st = status(run_dir)
    assert st["state"] == "completed" and st["attempt"] == 2
    assert [a["attempt"] for a in st["attempts"]] == [1, 2] and st["attempts"][0]["exit_code"] != 0
    starts = events(run_dir, "run_start")
    assert [s["attempt"] for s in starts] == [1, 2]
    assert starts[1]["start_step"] == 8  # the newest checkpoint before the crash at step 12
    assert events(run_dir, "run_end")[-1]["status"] == "completed"
    assert "attempt 2 started" in out_a
    # the supervisor ran the incident rules on the crash before starting attempt 2
    incidents = [json.loads(l) for l in (run_dir / "incidents.jsonl").read_text().splitlines()]
    assert any(i["code"] == "crash" for i in incidents), incidents

    assert procs[1].returncode == 1, out_b + err_b
    run_dir = run_dir_from(out_b)
    st = status(run_dir)
    assert st["state"] == "failed" and st["attempt"] == 1 and st["exit_code"] != 0 and st["reason"]
    # the end line names the rank that raised, with its error (from the crash incident)
    assert "run failed (rank 0: RuntimeError: injected crash at step" in out_b, out_b
    assert "incident [error] crash" in out_a, out_a     # a supervisor incident, now printed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_node_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[subprocess.Popen[str]]]:
    """Two `mt launch --node-rank K` of one preset (a 2-node job on loopback), started early so
    they train while the crash test runs."""
    tmp = tmp_path_factory.mktemp("two-node")
    preset = write_preset(tmp / "p.toml", tmp / "runs", train={"max_steps": 16},
                          launch={"nproc_per_node": 1, "nnodes": 2, "rdzv_endpoint": f"127.0.0.1:{_free_port()}"})
    nodes = [subprocess.Popen([*MT, "launch", str(preset), "--headless", "--node-rank", str(k)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
             for k in (0, 1)]
    yield nodes
    for p in nodes:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_two_node_loopback_job_trains(two_node_job: list[subprocess.Popen[str]]) -> None:
    (out0, err0), (out1, err1) = (p.communicate(timeout=300) for p in two_node_job)
    node0 = subprocess.CompletedProcess(two_node_job[0].args, two_node_job[0].returncode, out0, err0)
    node1 = two_node_job[1]
    assert node0.returncode == 0, node0.stdout + node0.stderr
    assert node1.returncode == 0, out1 + err1
    dirs = [run_dir_from(node0.stdout), run_dir_from(out1)]
    assert dirs[1].name.endswith("-node1")
    for d in dirs:
        st = status(d)
        assert st["state"] == "completed" and st["nnodes"] == 2
    # exactly one node holds global rank 0 and with it the event stream of a 2-rank world
    holders = [d for d in dirs if events(d, "run_start")]
    assert len(holders) == 1
    start = events(holders[0], "run_start")[0]
    assert start["world_size"] == 2 and start["nnodes"] == 2
    assert events(holders[0], "run_end")[-1]["status"] == "completed"
    ranks = sorted(int(r) for d in dirs for r in status(d)["worker_pids"])
    assert ranks == [0, 1]


def test_without_a_terminal_there_is_no_dashboard_and_no_spinning(tmp_path: Path, runs: Path) -> None:
    # as `mt launch`/`mt resume` in a non-interactive shell or a batch job: stdin and stdout not a TTY
    script = REPO / "tests" / "library" / "scripts" / "plain_loop.py"
    proc = subprocess.Popen([*MT, "launch", str(script), "--nproc", "1", "--runs-dir", str(runs), "--",
                             "--steps", "60", "--sleep", "0.1"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_dir = wait_for(lambda: next(iter(runs.glob("plain_loop-*")), None), 60, "the run directory")
        wait_for(lambda: events(run_dir, "step") or proc.poll() is not None, 120, "the first step")
        me = psutil.Process(proc.pid)
        before = sum(me.cpu_times()[:2])
        time.sleep(3.0)
        busy = sum(me.cpu_times()[:2]) - before
        assert busy < 0.6, f"mt used {busy:.2f} s of CPU in 3 s with no terminal"
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "run completed" in out, out + err
    assert err.splitlines() == ["mt: stdin and stdout not a terminal: no dashboard; following the run as with --headless"]
    watched = mt("watch", run_dir, timeout=60)  # a finished run: its lines, then the exit code
    assert watched.returncode == 0 and "stdout not a terminal" in watched.stderr, watched.stdout + watched.stderr
