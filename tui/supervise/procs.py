"""Find and signal the processes that belong to one run (supervisor, torchrun, workers)."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import psutil

from mt.contract import door
from tui.read.procs import run_processes

_PR_SET_PDEATHSIG = 1
# What `mt kill` (and a Slurm run's `scancel --signal=USR1`) sends every process of a run: a kill,
# never a stop. SIGTERM is the graceful stop (mt stop for a bare script, Slurm's preemption), which
# every rank answers with a checkpoint; nothing of mt's catches SIGUSR1 in a rank (its default
# action ends the process at once, no save) nor in torchrun (not in its signals to forward), and
# the supervisor reads it as "killed: never restart" (tui/supervise/supervisor.py `_on_kill`).
KILL_SIGNAL = signal.SIGUSR1


def die_with_parent() -> None:
    """preexec_fn for torchrun: SIGTERM it when the supervisor dies (even by SIGKILL).

    torchrun forwards SIGTERM to the workers, which stop gracefully, so a killed supervisor
    never leaves training running forever.
    """
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class SignalReport:
    """What signalling did (terminate_all, kill_all, `mt kill`): who got the first signal (SIGTERM,
    or `mt kill`'s SIGUSR1), who needed SIGKILL, who is still there; `state`: the run's state after
    `mt kill`; `cancelled`: the Slurm job `mt kill` cancelled (Slurm ended its processes, not us)."""

    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    state: str = ""
    cancelled: str | None = None

    def merge(self, other: "SignalReport") -> None:
        """Add who `other` signalled (its survivors are for the caller to count again)."""
        self.terminated += [p for p in other.terminated if p not in self.terminated]
        self.killed += [p for p in other.killed if p not in self.killed]


def terminate_all(procs: list[psutil.Process], grace_s: float, first: int = signal.SIGTERM) -> SignalReport:
    """`first` (SIGTERM: a graceful stop) to each process, wait up to grace_s, then SIGKILL whatever is left."""
    report = SignalReport()
    for p in procs:
        try:
            p.send_signal(first)
            report.terminated.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    rest = kill_all(alive)
    report.killed, report.survivors = rest.killed, rest.survivors
    return report


def others(run_dir: Path, pids: Iterable[int | None], node: str | None) -> list[psutil.Process]:
    """`run_processes` but the calling one (a supervisor ending its torchrun, ranks and their children)."""
    return [p for p in run_processes(run_dir, pids, node=node) if p.pid != os.getpid()]


def send_all(procs: list[psutil.Process], sig: int) -> None:
    """`sig` to each process, now; one gone meanwhile is skipped."""
    for p in procs:
        try:
            p.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def kill_all(procs: list[psutil.Process]) -> SignalReport:
    """SIGKILL each process at once (no graceful stop: it would write where it must not), and wait."""
    report = SignalReport()
    for p in procs:
        try:
            p.kill()
            report.killed.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(procs, timeout=5.0)
    report.survivors = [p.pid for p in still]
    return report


def daemonize(log_path: Path) -> None:
    """Fork once more so the supervisor is nobody's child (init reaps it); the parent prints its
    pid and exits. stdout/stderr go to the supervisor log (tracebacks included)."""
    pid = os.fork()
    if pid > 0:
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()
        os._exit(0)
    fd = door.open_append(log_path)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)


def file_logger(path: Path) -> logging.Logger:
    """The supervisor's logger, writing to `path` (logs/supervisor.log of its node)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger(f"mt.supervisor.{path}")
    log.setLevel(logging.INFO)
    log.propagate = False
    if not log.handlers:
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
    return log
