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
from mt.contract.paths import ENV_NODE

_PR_SET_PDEATHSIG = 1
# What `mt kill` (and a Slurm run's `scancel --signal=USR1`) sends every process of a run: a kill,
# never a stop. SIGTERM is the graceful stop (mt stop for a bare script, Slurm's preemption), which
# every rank answers with a checkpoint; nothing of mt's catches SIGUSR1 in a rank (its default
# action ends the process at once, no save) nor in torchrun (not in its signals to forward), and
# the supervisor reads it as "killed: never restart" (tui/run/supervisor.py `_on_kill`).
KILL_SIGNAL = signal.SIGUSR1


def die_with_parent() -> None:
    """preexec_fn for torchrun: SIGTERM it when the supervisor dies (even by SIGKILL).

    torchrun forwards SIGTERM to the workers, which stop gracefully, so a killed supervisor
    never leaves training running forever.
    """
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


_CLOCK_SLACK_S = 2.0  # a start time is boot time (whole seconds) + ticks: compare loosely


def alive(proc: psutil.Process | int | None, born_by: float | None = None) -> bool:
    """The one test of "is this process alive": it exists, is not a zombie, and is the process
    meant. A psutil.Process must still have the start time it was found with; a bare pid, given
    `born_by`, must have started by then (a later start is another program that reused the pid)."""
    if proc is None or isinstance(proc, bool) or (isinstance(proc, int) and proc <= 0):
        return False
    try:
        p = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        if not p.is_running() or p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        return born_by is None or p.create_time() <= born_by + _CLOCK_SLACK_S
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def _cmdline_names_run(proc: psutil.Process, run_dir: str) -> bool:
    """Whether this process was started for run_dir (`--run-dir DIR` in its command line)."""
    try:
        args = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    for i, a in enumerate(args[:-1]):
        if a == "--run-dir" and os.path.realpath(args[i + 1]) == run_dir:
            return True
    return any(a == f"--run-dir={run_dir}" for a in args)


def run_process(pid: int, run_dir: Path) -> psutil.Process | None:
    """The live process `pid` if its command line names run_dir (a recorded pid may be reused)."""
    try:
        proc = psutil.Process(pid)
    except (psutil.NoSuchProcess, ValueError):
        return None
    return proc if _cmdline_names_run(proc, os.path.realpath(run_dir)) and alive(proc) else None


def run_processes(run_dir: Path, pids: Iterable[int | None] = (), node: str | None = None) -> list[psutil.Process]:
    """Every live process of a run: anything whose command line names the run directory
    (supervisor, torchrun, workers — even orphans), and all their descendants.

    `pids` (recorded in status.json) are only a hint: a pid whose command line does not name
    the run may have been reused by another program, and is never included. `node`: only that
    node's (MT_NODE, or Slurm's SLURMD_NODENAME, in its environment): a job's nodes may share a machine."""
    target = os.path.realpath(run_dir)
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        if pid and pid != me:
            try:
                proc = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
            if _cmdline_names_run(proc, target):
                found[pid] = proc
    for proc in psutil.process_iter():
        if proc.pid != me and proc.pid not in found and _cmdline_names_run(proc, target):
            found[proc.pid] = proc
    if node is not None:
        found = {pid: p for pid, p in found.items() if _on_node(p, node)}
    for proc in list(found.values()):
        try:
            for child in proc.children(recursive=True):
                if child.pid != me:
                    found.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
    return [p for p in found.values() if alive(p)]


def _on_node(proc: psutil.Process, node: str) -> bool:
    try:
        env = proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return (env.get(ENV_NODE) or env.get("SLURMD_NODENAME")) == node


def rank_processes(torchrun_pid: int | None) -> dict[int, psutil.Process]:
    """torchrun's worker processes by global rank (read from each worker's RANK variable)."""
    if not torchrun_pid:
        return {}
    try:
        children = psutil.Process(torchrun_pid).children()
    except psutil.NoSuchProcess:
        return {}
    ranks: dict[int, psutil.Process] = {}
    for child in children:
        try:
            rank = child.environ().get("RANK")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if rank is not None and rank.isdigit():
            ranks[int(rank)] = child
    return ranks


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
