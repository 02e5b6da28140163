"""status.json has one reader, one writer and one judge of liveness: every caller gives the same
answer on the same file, however hostile, and on the same dead, zombie or reused process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mt.contract.config import MonitorConfig
from mt.contract.paths import RunPaths
from mt.contract.status import Status, read_status, write_status
from tests.diagnose.fakerun import FakeRun, dead_pid
from tests.tui.synth import SynthRun
from tui.diagnose.probes import ProcReader
from tui.read.procs import alive
from tui.read.rundir import liveness
from tui.read.watcher import Watcher
from tui.report.runs import run_row
from tui.supervise.sampler import SystemSampler

SUPERVISED = {
    "state": "running", "attempt": 2, "supervisor_pid": 41, "torchrun_pid": 42, "direct": False,
    "worker_pids": {"0": 43, "1": 44}, "started": 1.5, "ended": None, "exit_code": None,
    "reason": "resuming from step-10", "nproc": 2, "nnodes": 1, "node_rank": 0, "preset": "/p.toml",
    "attempts": [{"attempt": 1, "started": 1.5, "torchrun_pid": 40, "ended": 9.0, "exit_code": 1}],
    "restarts_left": 0, "owner": "script", "owner_cmdline": ["python", "train.py"],
}


def test_the_file_round_trips_key_for_key(tmp_path: Path) -> None:
    """What the writer puts on disk is what the reader took, and a fresh run's optional keys stay absent."""
    paths = RunPaths(tmp_path)
    write_status(paths, Status.parse(SUPERVISED))
    assert json.loads(paths.status.read_text()) == SUPERVISED
    write_status(paths, Status(state="starting", attempt=0, started=1.0, nproc=1, nnodes=1, node_rank=0, preset="/p"))
    on_disk = json.loads(paths.status.read_text())
    assert on_disk["state"] == "starting" and on_disk["supervisor_pid"] is None
    assert not {"direct", "attempts", "restarts_left", "owner", "owner_cmdline"} & set(on_disk)


def test_a_hostile_status_json_reads_as_defaults_and_never_raises(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    assert read_status(tmp_path) == Status() and not read_status(tmp_path).found   # missing
    for text in ("", '{"state": "runn', "[1, 2]", "null", "[" * 100_000 + "]" * 100_000, '"running"'):
        paths.status.write_text(text)
        assert read_status(tmp_path) == Status(), text
    wrong = {k: [] if not isinstance(v, list) else "x" for k, v in SUPERVISED.items()}
    paths.status.write_text(json.dumps({**wrong, "state": "exploded", "attempt": True}))
    st = read_status(tmp_path)
    assert st == Status() and st.found and "supervisor_pid" in st.invalid
    assert liveness(st) == "lost"   # a file no reader may trust is never a live run


def _running_with(root: Path, pid: int | None, written: float | None = None) -> SynthRun:
    r = SynthRun(root, max_steps=50)
    r.run_start()
    r.step(1, loss=2.0)
    r.flush()
    r.status("running")
    st = json.loads(r.paths.status.read_text())
    st["supervisor_pid"] = pid
    r.paths.status.write_text(json.dumps(st))
    if written is not None:
        os.utime(r.paths.status, (written, written))
    return r


def _viewer_lost(root: Path) -> bool:
    w = Watcher(root)
    w._live_checked -= 10   # its first check waits 2 s (psutil); here it is due at once
    w.poll()
    return w.follower.state.supervisor_lost


def _hangs(root: Path, pid: int | None, written: float | None = None) -> bool:
    """Whether the monitor's hang rule fires on a stepping run gone quiet, its status naming `pid`."""
    m = MonitorConfig(hang_floor_s=5.0)
    run = FakeRun(root, monitor=m)
    run.start()
    for _ in range(20):
        run.do_step(step_time=0.3)
    run.status({"state": "running", "attempt": 1, "exit_code": None, "supervisor_pid": pid})
    if written is not None:
        os.utime(run.paths.status, (written, written))
    run.idle(30)
    return bool(run.opened("hang"))


def test_running_with_a_dead_supervisor_is_lost_to_ls_the_viewer_and_the_monitor(tmp_path: Path) -> None:
    pid = dead_pid()
    r = _running_with(tmp_path / "dead", pid)
    assert liveness(read_status(r.root)) == "lost"
    assert run_row(r.root).state == "lost"
    assert _viewer_lost(r.root)
    assert not _hangs(tmp_path / "dead-monitor", pid)       # no hang to diagnose in a lost run
    assert _hangs(tmp_path / "live-monitor", os.getpid())    # the same run with its supervisor: a hang


def test_a_reused_pid_is_not_the_supervisor(tmp_path: Path) -> None:
    """A process that started after status.json named its pid is another program."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        long_ago = time.time() - 3600
        r = _running_with(tmp_path / "reused", other.pid, written=long_ago)
        assert liveness(read_status(r.root)) == "lost"
        assert run_row(r.root).state == "lost"
        assert _viewer_lost(r.root)
        assert not _hangs(tmp_path / "reused-monitor", other.pid, written=long_ago)
        fresh = _running_with(tmp_path / "fresh", other.pid)   # named after it started: it is the one
        assert liveness(read_status(fresh.root)) == "live" and not _viewer_lost(fresh.root)
    finally:
        other.kill()
        other.wait()


def test_a_zombie_is_dead_to_every_caller(tmp_path: Path) -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while open(f"/proc/{zombie.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        assert not alive(zombie.pid)
        r = _running_with(tmp_path / "z", zombie.pid)
        assert liveness(read_status(r.root)) == "lost" and run_row(r.root).state == "lost"
        assert ProcReader().read({0: zombie.pid}, None, detailed=False)[0].alive is False
        sampler = SystemSampler()
        try:
            assert sampler.sample({0: zombie.pid})["ranks"][0]["alive"] is False
        finally:
            sampler.close()
    finally:
        zombie.wait()
    assert alive(os.getpid()) and not alive(zombie.pid) and not alive(None) and not alive(True)
