"""The rank processes a capture reads: a run's on this node (mt launch, or a script's own `mt.init`
under plain torchrun), or those of any torchrun job found from one pid (`mt stacks --pid`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from mt.contract.status import Status, read_status
from tui.read.procs import alive, rank_processes, run_processes


class NoRanksError(RuntimeError):
    """No live rank process to capture; str() is the message for the user."""


def _has_rank(proc: psutil.Process) -> bool:
    return "RANK" in _env(proc)


def find_ranks(run_dir: Path, node: str | None = None) -> dict[int, psutil.Process]:
    """This node's live rank processes by global rank: the RANK-carrying children of the run's launchers."""
    status = read_status(Path(run_dir), node)
    if status.by_script:  # mt.init's own run: rank 0 stands in for the supervisor; its launcher is torchrun
        return _job_of(own_rank0(status))
    recorded = [status.torchrun_pid, status.supervisor_pid]
    ranks: dict[int, psutil.Process] = {}
    # `node`: a job's shared run directory: only the launchers (and so the ranks) this node's supervisor started
    for proc in run_processes(run_dir, [p for p in recorded if isinstance(p, int)], node=node):
        if not _has_rank(proc):  # a rank, or a rank's own child (a DataLoader worker), is not a launcher
            ranks.update(rank_processes(proc.pid))
    return ranks


def _env(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def _job_of(procs: list[psutil.Process]) -> dict[int, psutil.Process]:
    """The ranks of the job one of its ranks belongs to: its launcher's RANK children, else the rank alone."""
    if not procs:
        return {}
    proc = procs[0]
    try:
        parent = proc.parent()
    except psutil.Error:
        parent = None
    ranks = rank_processes(parent.pid) if parent is not None and not _has_rank(parent) else {}
    if ranks:
        return ranks
    try:
        rank = proc.environ().get("RANK", "0")
    except psutil.Error:
        return {}
    return {int(rank) if rank.isdigit() else 0: proc}


def _below(proc: psutil.Process) -> dict[int, psutil.Process]:
    """The ranks under a process that has none itself: torchrun's agent, or what started it (a shell, `timeout`, srun)."""
    ranks = rank_processes(proc.pid)
    try:
        launchers = [] if ranks else [p for p in proc.children(recursive=True) if not _has_rank(p)]
    except psutil.Error:
        launchers = []
    for launcher in launchers:
        ranks.update(rank_processes(launcher.pid))
    return ranks


def ranks_of_pid(pid: int) -> dict[int, psutil.Process]:
    """The ranks of the torchrun job `pid` is part of: the agent (or what started it), a rank, or a
    rank's DataLoader worker (climbing to the rank itself); NoRanksError if none."""
    try:
        proc = psutil.Process(pid)
        while _has_rank(proc) and (parent := proc.parent()) is not None and _has_rank(parent):
            proc = parent  # a DataLoader worker, or a worker's worker: up to the rank itself
    except psutil.NoSuchProcess:
        raise NoRanksError(f"pid {pid}: no such process") from None
    except psutil.Error as e:
        raise NoRanksError(f"pid {pid}: cannot read it ({e})") from None
    ranks = _job_of([proc]) if _has_rank(proc) else _below(proc)
    if not ranks:
        raise NoRanksError(f"pid {pid}: not a torchrun agent or one of its ranks (no RANK in its "
                           "environment or its children's)")
    return ranks


def own_rank0(status: Status) -> list[Any]:
    """Rank 0 of a run mt.init made, if its pid still runs the command line it recorded."""
    pid, cmdline = status.supervisor_pid, status.owner_cmdline
    if pid is None or cmdline is None or not alive(pid, born_by=status.written):
        return []
    try:
        proc = psutil.Process(pid)
        return [proc] if proc.cmdline() == cmdline else []
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []
