"""The supervisor's parts on their own: torchrun command, env, sampler, process finding, signals."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import psutil

from mt.contract.checkpoints import folders, newest
from mt.contract.paths import RunPaths
from mt.contract.preset import config_from_dict
from tests.cli.conftest import SMALL, wait_for
from tui.read.procs import rank_processes, run_processes, usable_cores
from tui.read.torchrun_log import torchrun_failures, worker_exit_code
from tui.supervise.lock import DirWatch
from tui.supervise.procs import terminate_all
from tui.supervise.sampler import SystemSampler
from tui.supervise.torchrun import torchrun_command, worker_env


def _cfg(**launch: object):
    raw = json.loads(json.dumps(SMALL))
    raw["launch"].update(launch)
    return config_from_dict(raw, "test")


def test_one_node_uses_the_loopback_rendezvous(tmp_path: Path) -> None:
    cmd = torchrun_command(_cfg(nproc_per_node=3), tmp_path, attempt=2, python="py")
    assert cmd[:4] == ["py", "-P", "-m", "engine.loopback"]  # torchrun with its stores on 127.0.0.1
    assert "--standalone" not in cmd and cmd[cmd.index("--rdzv-backend") + 1] == "mt-loopback"
    assert cmd[cmd.index("--local-addr") + 1] == "127.0.0.1"  # the workers' MASTER_ADDR
    assert cmd[cmd.index("--nproc-per-node") + 1] == "3"
    assert cmd[-9:] == ["--no-python", "py", "-P", "-m", "engine", "--run-dir", str(tmp_path), "--attempt", "2"]
    assert cmd[cmd.index("--max-restarts") + 1] == "0"


def test_several_nodes_use_c10d(tmp_path: Path) -> None:
    cfg = _cfg(nnodes=2, rdzv_endpoint="10.0.0.1:29500", node_rank=1)
    cmd = torchrun_command(cfg, tmp_path, attempt=1)
    assert cmd[:4] == [sys.executable, "-P", "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "10.0.0.1:29500"
    assert cmd[cmd.index("--nnodes") + 1] == "2"
    # every node must derive the same rendezvous id from the same preset
    other = torchrun_command(_cfg(nnodes=2, rdzv_endpoint="10.0.0.1:29500", node_rank=0), tmp_path / "x", 1)
    assert cmd[cmd.index("--rdzv-id") + 1] == other[other.index("--rdzv-id") + 1]


def test_omp_threads_split_between_local_workers() -> None:
    env = worker_env(_cfg(nproc_per_node=2), base={"PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == str(max(1, usable_cores() // 2))
    env = worker_env(_cfg(nproc_per_node=64), base={})
    assert env["OMP_NUM_THREADS"] == "1"
    env = worker_env(_cfg(nproc_per_node=1), base={"OMP_NUM_THREADS": "7"})
    assert env["OMP_NUM_THREADS"] == "7"  # the user's choice wins
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"  # one node: loopback only
    assert "GLOO_SOCKET_IFNAME" not in worker_env(_cfg(nnodes=2, rdzv_endpoint="10.0.0.1:29500"), base={})


def test_one_process_gets_what_torchrun_gives_its_worker() -> None:
    with socket.create_server(("127.0.0.1", 0)) as store:
        env = worker_env(_cfg(nproc_per_node=1), base={"MASTER_ADDR": "10.1.1.1"}, store=store, attempt=3)
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(store.getsockname()[1])
        assert env["MT_STORE_FD"] == str(store.fileno()) and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert {env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK")} == {"0"}
    assert {env[k] for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE")} == {"1"}
    assert env["TORCHELASTIC_RUN_ID"] == "mt-t-a3"
    assert "MASTER_ADDR" not in worker_env(_cfg(nproc_per_node=1), base={"MASTER_ADDR": "10.1.1.1"})  # not the shell's


BUSY = "import time\nt = time.time()\nwhile time.time() - t < 60: pass\n"


def test_sampler_reads_live_and_dead_rank_processes() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        sampler = SystemSampler()
        first = sampler.sample({0: proc.pid, 1: 999_999_999})
        second = wait_for(lambda: (s := sampler.sample({0: proc.pid, 1: 999_999_999}))["ranks"][0]["cpu_pct"] and s,
                          30, "a CPU reading of the busy process")
        for s in (first, second):
            assert s["v"] == 1 and isinstance(s["t"], float)
            assert s["nvml"] == bool(s["gpus"]) or (s["nvml"] and s["gpus"] == [])
            if not s["nvml"]:
                assert s["nvml_error"] and s["gpus"] == []
            host = s["host"]
            assert 0 < host["mem_used_bytes"] < host["mem_total_bytes"] and host["load1"] is not None
        r0, r1 = second["ranks"]
        assert r0 == {**r0, "rank": 0, "pid": proc.pid, "alive": True} and r0["rss_bytes"] > 0
        assert r0["cpu_pct"] > 0
        assert r1 == {"rank": 1, "pid": 999_999_999, "cpu_pct": None, "rss_bytes": None, "alive": False}
        proc.kill()
        proc.wait()
        gone = sampler.sample({0: proc.pid})["ranks"][0]
        assert gone["alive"] is False
        for gpu in second["gpus"]:  # only where NVML works (a GPU machine)
            assert set(gpu) == {"index", "name", "util_pct", "mem_used_bytes", "mem_total_bytes", "temp_c", "power_w"}
        sampler.close()
    finally:
        proc.kill()
        proc.wait()


# A process that names a run directory like torchrun does, with a child that ignores SIGTERM.
STUBBORN_TREE = (
    "import signal, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nprint(1, flush=True)\\ntime.sleep(120)'],"
    " env={'RANK': '0'}, stdout=subprocess.PIPE, start_new_session=True)\n"
    "child.stdout.readline()\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


def test_run_processes_finds_the_tree_and_terminate_all_escalates(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", STUBBORN_TREE, "--run-dir", str(run_dir)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        procs = run_processes(run_dir)
        pids = {p.pid for p in procs}
        child_pid = psutil.Process(parent.pid).children()[0].pid
        assert pids == {parent.pid, child_pid}
        assert {r: p.pid for r, p in rank_processes(parent.pid).items()} == {0: child_pid}
        assert run_processes(tmp_path / "other") == []
        report = terminate_all(procs, grace_s=1.0)
        assert set(report.terminated) == pids
        assert report.killed == [child_pid]  # it ignored SIGTERM, so it needed SIGKILL
        assert report.survivors == []
        assert not psutil.pid_exists(parent.pid)  # psutil reaped our own child
        assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        parent.kill()
        parent.wait()


def test_worker_exit_code_is_the_root_cause(tmp_path: Path) -> None:
    log = tmp_path / "torchrun.log"
    old = "old attempt\n  exitcode  : 9 (pid: 1)\n"
    report = ("Failures:\n[1]:\n  rank      : 0\n  exitcode  : -15 (pid: 11)\n"
              "Root Cause (first observed failure):\n[0]:\n  rank      : 1\n  exitcode  : 2 (pid: 12)\n")
    log.write_text(old + report)
    assert worker_exit_code(log, len(old)) == 2
    assert worker_exit_code(log, log.stat().st_size) is None


def test_the_supervisor_and_the_diagnosis_read_one_torchrun_report(tmp_path: Path) -> None:
    """A worker's own `exitcode: 7` line is not torchrun's report, and only the newest report counts."""
    log = tmp_path / "torchrun.log"
    report = ("Failures:\n[1]:\n  rank      : 0\n  exitcode  : -15 (pid: 11)\n"
              "Root Cause (first observed failure):\n[0]:\n  rank      : 1\n  exitcode  : {code} (pid: 12)\n")
    cases = {"no report": "[rank0]: exitcode: 7\n", "two reports": report.format(code=3) + report.format(code=-9),
             "a worker's line, then the report": "exitcode: 7\nRoot Cause\n" + report.format(code=2)}
    for text in cases.values():
        log.write_text(text)
        fails = torchrun_failures(text)
        assert worker_exit_code(log, 0) == (fails[0].exit_code if fails else None)
    log.write_text(cases["no report"])
    assert worker_exit_code(log, 0) is None
    log.write_text(cases["two reports"])
    assert worker_exit_code(log, 0) == -9


def test_only_checkpoints_with_a_well_formed_manifest_count(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    files = {n: {"sha256": "0" * 64, "bytes": 1} for n in ("model.pt", "optim.pt", "train.pt")}
    good = json.dumps({"format": "mt-checkpoint", "version": 1, "files": files})  # sizes checked, not hashes
    for name, manifest in (("step-10", good), ("step-30", None), ("step-20", good), (".tmp-step-40-1", good),
                           ("step-50", "{}"), ("step-60", good.replace('"bytes": 1}}', '"bytes": 2}}'))):
        (root / name).mkdir(parents=True)
        for f in files:
            (root / name / f).write_bytes(b"x")
        if manifest:
            (root / name / "manifest.json").write_text(manifest)
    assert [s for s, _ in folders(root, "sizes")] == [20, 10]
    assert newest(root, "sizes").path == root / "step-20"


def test_the_viewer_and_the_supervisor_count_the_same_newest_checkpoint(tmp_path: Path) -> None:
    """A newer step folder without a manifest (a copy still in progress) is the newest for no one:
    the viewer's quick read once took any `step-<S>` folder."""
    from tui.read.bulk import newest_checkpoint_dir

    root = tmp_path / "checkpoints"
    files = {n: {"sha256": "0" * 64, "bytes": 1} for n in ("model.pt", "optim.pt", "train.pt")}
    for name in ("step-10", "step-20"):
        (root / name).mkdir(parents=True)
        for f in files:
            (root / name / f).write_bytes(b"x")
    (root / "step-10" / "manifest.json").write_text(json.dumps({"format": "mt-checkpoint", "version": 1, "files": files}))
    shown = newest_checkpoint_dir(RunPaths(tmp_path))
    assert shown is not None and (shown.step, shown.path) == (10, str(root / "step-10"))
    assert newest(root, "sizes").path == root / "step-10"  # what the supervisor logs it restarts from


def test_dir_watch_notices_a_deleted_or_replaced_run_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    watch = DirWatch(run)
    assert watch.lost() is None
    run.rename(tmp_path / "elsewhere")
    run.mkdir()  # same path, another folder
    assert "replaced" in (watch.lost() or "")
    run.rmdir()
    assert "deleted" in (watch.lost() or "")
