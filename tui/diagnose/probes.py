"""What the incident monitor reads besides the JSONL streams: heartbeats, /proc, log tails."""
from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path
from typing import Any

from mt.contract import door
from mt.contract.events import as_float
from tui.diagnose.findings import ChildProc, RankProc
from tui.read.procs import alive

# x86-64 numbers of the calls a training process blocks in (others are shown by number).
_SYSCALLS_X86_64 = {
    0: "read", 1: "write", 7: "poll", 16: "ioctl", 23: "select", 24: "sched_yield", 35: "nanosleep",
    44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 202: "futex",
    230: "clock_nanosleep", 232: "epoll_wait", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
    441: "epoll_pwait2",
}
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def read_tail(path: Path, max_bytes: int = 32768, since: int = 0) -> str:
    """The last max_bytes of a text file written after offset `since` ('' when missing)."""
    try:
        with door.open_file(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            since = since if since <= size else 0  # truncated or replaced: all of it is new
            f.seek(max(since, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, utime+stime ticks) from /proc/PID/stat, or None if gone/unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()  # the command name may hold spaces
    try:
        return fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def _syscall(pid: int) -> str | None:
    """The system call the main thread is blocked in (needs ptrace rights: our descendants)."""
    try:
        with open(f"/proc/{pid}/syscall", encoding="ascii") as f:
            first = f.read().split()
    except OSError:
        return None
    if not first:
        return None
    if first[0] == "running":
        return "running"
    try:
        num = int(first[0])
    except ValueError:
        return None
    if num < 0:
        return None
    if platform.machine() in ("x86_64", "AMD64"):
        return _SYSCALLS_X86_64.get(num, f"syscall {num}")
    return f"syscall {num}"


def _children(pid: int) -> list[int]:
    """Child pids of a process (needs CONFIG_PROC_CHILDREN; empty where the kernel lacks it)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(4096).replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _child(pid: int) -> ChildProc:
    st = _stat(pid)
    return ChildProc(pid, st[0] if st else None, _syscall(pid), _cmdline(pid))


def rank_detail(pid: int) -> tuple[str | None, list[ChildProc]]:
    """(the system call a rank waits in, its children: DataLoader workers) from /proc; what the
    rules read of a rank of this node, and what a job's other node puts in its samples for them."""
    return _syscall(pid), [_child(c) for c in _children(pid)]


def sample_detail(pid: int) -> dict[str, Any]:
    """rank_detail as a system.jsonl rank entry's `syscall` and `workers` (docs/run-directory.md)."""
    call, children = rank_detail(pid)
    return {"syscall": call, "workers": [{"pid": c.pid, "state": c.state, "syscall": c.syscall, "cmdline": c.cmdline[:200]}
                                          for c in children]}


def sampled_children(workers: list[dict[str, Any]]) -> list[ChildProc]:
    """A sample's `workers` of a rank (another node's), as the rules' ChildProc."""
    return [ChildProc(w["pid"], w.get("state"), w.get("syscall"), w.get("cmdline") or "") for w in workers]


class ProcReader:
    """Per-rank process facts; keeps the last CPU tick counts to turn them into a CPU %."""

    def __init__(self) -> None:
        self._ticks: dict[int, tuple[float, int]] = {}

    def read(self, pids: dict[int, int], sample: dict[str, Any] | None, detailed: bool,
             now: float | None = None) -> dict[int, RankProc]:
        """pids: rank -> pid. `sample` is the newest system.jsonl line (its CPU % wins)."""
        now = time.monotonic() if now is None else now
        from_sample = {int(r["rank"]): r for r in (sample or {}).get("ranks") or [] if isinstance(r, dict) and "rank" in r}
        out = {}
        for rank, pid in pids.items():
            p = RankProc(rank, pid)
            st = _stat(pid)
            p.alive = st is not None and alive(pid)
            if st is not None:
                p.state = st[0]
                last = self._ticks.get(pid)
                self._ticks[pid] = (now, st[1])
                if last and now > last[0]:
                    p.cpu_pct = round(100.0 * (st[1] - last[1]) / _TICK / (now - last[0]), 1)
            entry = from_sample.get(rank) or {}
            cpu = as_float(entry.get("cpu_pct"))
            if not math.isnan(cpu) and entry.get("pid") == pid:
                p.cpu_pct = cpu
            if detailed and p.alive:
                p.syscall, p.children = rank_detail(pid)
            out[rank] = p
        return out
