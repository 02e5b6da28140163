"""The data the diagnosis rules share: rank processes, one poll's observation. What they build is an
`Incident` (mt/contract/incident.py), the same type rank 0's rules (mt/rules.py) build."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mt.contract.status import Status, judge
from tui.format.fmt import fmt_rank
from tui.read.nodes import NodeExit

# System calls that mean "waiting for someone else": a peer in a collective, a queue, a lock.
WAITING_SYSCALLS = frozenset({"futex", "poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait",
                              "epoll_pwait2", "recvfrom", "recvmsg", "read", "sched_yield"})


@dataclass
class ChildProc:
    """A process a rank started (its DataLoader workers), as seen in /proc."""

    pid: int
    state: str | None = None
    syscall: str | None = None
    cmdline: str = ""


@dataclass
class RankProc:
    """What one rank's process was doing when the monitor looked (None: could not be read)."""

    rank: int
    pid: int | None = None
    alive: bool | None = None
    cpu_pct: float | None = None
    state: str | None = None
    """Kernel state letter from /proc (R running, S sleeping, D disk wait, Z zombie)."""
    syscall: str | None = None
    """The system call it is blocked in, e.g. futex or clock_nanosleep; "running" if on CPU."""
    children: list[ChildProc] = field(default_factory=list)
    """Its child processes (DataLoader workers); read only when the run has gone quiet."""
    remote: bool = False
    """On another node of a job: read from that node's system sample (no /proc: no syscall, no children)."""


@dataclass
class Observation:
    """What the monitor read this poll, besides the streams."""

    now: float
    status: Status = field(default_factory=Status)
    heartbeats: dict[int, dict[str, Any]] = field(default_factory=dict)
    procs: dict[int, RankProc] = field(default_factory=dict)
    rank_logs: dict[int, str] = field(default_factory=dict)
    """Tails of logs/rank<N>.log, read only once a worker has exited."""
    torchrun_log: str = ""
    fresh_error: bool = False
    """A rank's log shows an error written after the last step: a crash under way."""
    new_steps: int = 0
    """Step events read since the previous poll (step-driven rules judge each of them)."""
    open_codes: frozenset[str] = frozenset()
    open_evidence: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Code -> evidence of the incident open now, with its `step` added."""
    supervisor_alive: bool = True
    """Inside the supervisor it is; a monitor on its own asks the process table."""
    node: str | None = None
    """The node whose files the monitor reads (a job's shared run directory), None for one machine."""
    nodes: dict[int, str] = field(default_factory=dict)
    """rank -> its node in a job's shared run directory; empty on one machine."""
    node_exits: dict[str, NodeExit] = field(default_factory=dict)
    """A job's nodes that failed this attempt, by name: each node's torchrun exit and the workers
    that failed there (rank, exit code, node), as its supervisor recorded them."""
    node_states: dict[str, str | None] = field(default_factory=dict)
    """A job's node -> the state its status.json last said (None: none), stale once its supervisor is gone."""

    def who(self, rank: int) -> str:
        """`rank 5 on node gpu-07` in a job, `rank 5` on one machine."""
        return fmt_rank(rank, self.nodes.get(rank))

    def whom(self, ranks: list[int]) -> str:
        """Several ranks in words: `3, 4` on one machine, `3 on node n2, 4 on node n2` in a job."""
        return ", ".join(self.who(r)[5:] for r in ranks)

    @property
    def live(self) -> bool:
        """The run goes on, as `judge` says of its status and supervisor."""
        return judge(self.status, lambda _: self.supervisor_alive) in ("starting", "live")

