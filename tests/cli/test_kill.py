"""`mt kill` and a SIGKILLed supervisor leave no process of the run behind."""
from __future__ import annotations

import fcntl
import os
import pty
import shutil
import signal
import struct
import subprocess
import termios
import threading
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from mt.contract.checkpoints import folders
from tests.cli.conftest import MT, REPO, PidTracker, events, mt, run_dir_from, status, wait_for, write_preset
from tui.read.procs import run_processes
from tui.supervise.control import kill_run

pytestmark = pytest.mark.slow

# Slow enough that it is still training when the test acts; kill/stop end it long before.
SLOW = {"train": {"max_steps": 3000}, "checkpoint": {"every_steps": 0}, "faults": {"step_sleep_s": 0.1}}
EVERY, KEEP = 5, 2


def _launch(tmp_path: Path, runs: Path, nproc: int = 2) -> Path:
    preset = write_preset(tmp_path / "p.toml", runs, **SLOW, launch={"nproc_per_node": nproc})
    res = mt("launch", preset, "--detach")
    assert res.returncode == 0, res.stderr
    return Path(res.stdout.strip())


def _track_until_training(run_dir: Path, nproc: int = 2) -> PidTracker:
    """Gather pids until every rank has stepped (so workers and their children are known)."""
    tracker = PidTracker(run_dir)

    def ready() -> bool:
        tracker.collect()
        hb = [run_dir / "heartbeat" / f"rank{r}" for r in range(nproc)]
        return bool(events(run_dir, "step")) and all(h.exists() for h in hb)

    wait_for(ready, 180, "both ranks to train")
    tracker.collect()
    return tracker


def _launch_headless(tmp_path: Path, runs: Path, nproc: int = 2, **sections: dict) -> tuple[subprocess.Popen[str], Path]:
    """`mt launch --headless` in its own session (like a terminal or a batch job)."""
    preset = write_preset(tmp_path / "p.toml", runs, **{**SLOW, **sections}, launch={"nproc_per_node": nproc})
    viewer = subprocess.Popen([*MT, "launch", str(preset), "--headless"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True)
    first = viewer.stdout.readline()
    return viewer, run_dir_from(first)


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[subprocess.Popen[str] | None, Path]]]:
    """Three runs started at once, so their start-ups overlap instead of adding up."""
    runs: dict[str, tuple[subprocess.Popen[str] | None, Path]] = {}
    # SIGTERM's way through torchrun to the workers is proven by the SIGKILLed supervisor below
    # (the kernel's SIGTERM to torchrun) and by tests/engine/test_control.py: the headless
    # viewer's part needs one rank (no torchrun start-up)
    for name, nproc in (("killed", 2), ("sigterm", 1)):
        tmp = tmp_path_factory.mktemp(name)
        # the killed run checkpoints on an interval and keeps the newest KEEP: a kill adds none, deletes none
        ckpt = {"checkpoint": {"every_steps": EVERY, "keep_last": KEEP}} if name == "killed" else {}
        runs[name] = _launch_headless(tmp, tmp / "runs", nproc, **ckpt)
    tmp = tmp_path_factory.mktemp("sigkill")
    runs["sigkill"] = _launch_in_dashboard(tmp, tmp / "runs")
    yield runs
    for viewer, run_dir in runs.values():  # never leak a run, whatever a test did
        if run_processes(run_dir):
            kill_run(run_dir, grace_s=2.0)
        if viewer is not None and viewer.poll() is None:
            viewer.kill()
            viewer.communicate()


class DashboardTerminal:
    """`mt launch PRESET` (no flags: it opens the dashboard) on a pseudo-terminal we drain."""

    def __init__(self, args: list[str]) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))

        def own_terminal() -> None:  # a session of its own, with the pty as its terminal
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, cwd=REPO,
                                     env={**os.environ, "TERM": "xterm-256color"}, preexec_fn=own_terminal)
        os.close(slave)
        self.screen = bytearray()
        # the app blocks once the pty buffer is full, so someone must keep reading it
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.screen += data

    def press(self, key: bytes) -> None:
        os.write(self.master, key)

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        self.proc.kill()

    def communicate(self) -> None:
        self.proc.wait()
        os.close(self.master)


def _launch_in_dashboard(tmp_path: Path, runs: Path) -> tuple[DashboardTerminal, Path]:
    preset = write_preset(tmp_path / "p.toml", runs, **SLOW)
    term = DashboardTerminal([*MT, "launch", str(preset)])
    found = wait_for(lambda: [p for p in runs.glob("*") if (p / "status.json").exists()], 60, "the run directory")
    return term, found[0]


def _listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket these processes listen on (read from /proc/net/tcp*)."""
    found = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        found += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def test_kill_during_run_leaves_nothing(started: dict) -> None:
    viewer, run_dir = started["killed"]
    tracker = _track_until_training(run_dir)
    wait_for(lambda: len(events(run_dir, "checkpoint")) >= KEEP, 120, f"{KEEP} interval checkpoints")
    # one node exposes nothing: torchrun's rendezvous and agent stores and gloo listen on loopback
    listening = _listening(tracker.alive())
    assert len(listening) >= 2 and all(ip == "127.0.0.1" for _, ip, _ in listening), listening
    # Ctrl-C in the headless viewer only detaches it: the run keeps going
    os.killpg(viewer.pid, signal.SIGINT)
    out, _ = viewer.communicate(timeout=30)
    assert viewer.returncode == 130 and "detached" in out
    assert status(run_dir)["state"] == "running" and not tracker.alive() == []
    assert len(tracker.pids) >= 4  # supervisor, torchrun, two workers
    res = mt("kill", run_dir, "--grace", "5")
    assert res.returncode == 0, res.stdout + res.stderr
    assert tracker.alive() == []
    assert run_processes(run_dir) == []
    st = status(run_dir)
    assert st["state"] == "killed"
    # no rank saved on the way out (SIGTERM would have been a stop, with its checkpoint): the newest
    # checkpoint is an interval one, and keep_last deleted none of the ones before it
    saved = events(run_dir, "checkpoint")
    assert [(c["reason"], c["step"] % EVERY) for c in saved] == [("interval", 0)] * len(saved), saved
    on_disk = sorted(step for step, _ in folders(run_dir / "checkpoints"))
    assert on_disk == [c["step"] for c in saved[-KEEP:]], (on_disk, saved)
    assert not [e for e in events(run_dir, "run_end") if e["status"] == "stopped"]
    again = mt("kill", run_dir)
    assert again.returncode == 2 and "already ended (killed)" in again.stderr


def test_kill_during_startup_leaves_nothing(tmp_path: Path, runs: Path) -> None:
    run_dir = _launch(tmp_path, runs)
    tracker = PidTracker(run_dir)
    tracker.collect()
    assert status(run_dir)["supervisor_pid"] in tracker.pids
    res = mt("kill", run_dir, "--grace", "5")
    assert res.returncode == 0, res.stdout + res.stderr
    tracker.collect()
    assert tracker.alive() == []
    # the supervisor is gone, so nothing can be started for this run any more
    assert run_processes(run_dir) == []
    assert status(run_dir)["state"] == "killed"
    assert not events(run_dir, "step")
    # nothing to resume from: a clear message, exit 2
    res = mt("resume", run_dir, "--detach")
    assert res.returncode == 2 and "no checkpoint" in res.stderr


def test_quitting_the_dashboard_leaves_the_run_running(started: dict) -> None:
    term, run_dir = started["sigkill"]
    tracker = _track_until_training(run_dir)
    wait_for(lambda: run_dir.name.encode() in term.screen or b"step" in term.screen, 60, "the dashboard to draw")
    term.press(b"q")
    wait_for(lambda: term.poll() is not None, 30, "the dashboard to quit")
    assert term.poll() == 0
    wait_for(lambda: f"re-attach with: mt watch {run_dir}".encode() in term.screen, 10, "how to re-attach")
    assert status(run_dir)["state"] == "running" and sorted(tracker.alive()) == sorted(tracker.pids)
    steps = len(events(run_dir, "step"))
    wait_for(lambda: len(events(run_dir, "step")) > steps, 60, "training to go on without a viewer")


def test_sigkilled_supervisor_does_not_leave_workers_running(started: dict) -> None:
    run_dir = started["sigkill"][1]
    tracker = _track_until_training(run_dir)
    sup = status(run_dir)["supervisor_pid"]
    os.kill(sup, signal.SIGKILL)
    # torchrun gets SIGTERM from the kernel (PDEATHSIG) and forwards it: the workers stop
    wait_for(lambda: not tracker.alive(), 90, f"every process of the run to exit (left: {tracker.alive()})")
    assert run_processes(run_dir) == []
    end = events(run_dir, "run_end")
    assert end and end[-1]["status"] == "stopped", end  # a graceful stop, not a crash
    assert end[-1]["step"] < 3000
    ls = mt("ls", run_dir.parent)
    assert "lost" in next(l for l in ls.stdout.splitlines() if l.startswith(run_dir.name))


def test_sigterm_to_headless_stops_the_run_gracefully(started: dict) -> None:
    viewer, run_dir = started["sigterm"]
    tracker = _track_until_training(run_dir, nproc=1)
    viewer.send_signal(signal.SIGTERM)  # what SLURM sends at the time limit
    out, err = viewer.communicate(timeout=120)
    assert viewer.returncode == 0, out + err
    assert "SIGTERM: stopping the run gracefully" in out and "run stopped" in out
    st = status(run_dir)
    assert st["state"] == "stopped"
    ck = events(run_dir, "checkpoint")[-1]
    assert ck["reason"] == "stop" and Path(ck["path"]).is_dir()
    wait_for(lambda: not tracker.alive(), 30, "the run's processes to exit")


def test_a_replaced_or_deleted_run_dir_ends_the_run(tmp_path: Path) -> None:
    dirs = {}
    for name in ("replaced", "deleted"):
        (tmp_path / name).mkdir()
        dirs[name] = _launch(tmp_path / name, tmp_path / name / "runs", nproc=1)  # no torchrun: quick
    trackers = {name: _track_until_training(d, nproc=1) for name, d in dirs.items()}
    # moved away and an empty folder put in its place: the supervisor ends the run, writes nothing
    run_dir = dirs["replaced"]
    moved = run_dir.with_name(run_dir.name + "-moved")
    run_dir.rename(moved)
    run_dir.mkdir()
    wait_for(lambda: not trackers["replaced"].alive(), 30, "the run in a replaced folder to end")
    assert list(run_dir.iterdir()) == []
    assert "replaced by another folder" in (moved / "logs" / "supervisor.log").read_text()
    # deleted while its supervisor cannot act: mt kill still finds every process of the path
    run_dir = dirs["deleted"]
    os.kill(status(run_dir)["supervisor_pid"], signal.SIGSTOP)
    shutil.rmtree(run_dir)
    res = mt("kill", run_dir, "--grace", "3")
    assert res.returncode == 0 and "state gone" in res.stdout, res.stdout + res.stderr
    assert trackers["deleted"].alive() == [] and not run_dir.exists()
