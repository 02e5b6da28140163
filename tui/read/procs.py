"""Facts about processes, read from /proc through psutil: is this the process meant, which
processes belong to a run, torchrun's ranks, the cores this process may use."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import psutil

from mt.contract.paths import ENV_NODE

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


def usable_cores() -> int:
    """CPU cores this process may run on (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
