"""What one node's supervisor learns of the others in a Slurm job's shared run directory.

One writer per file: each node's supervisor writes only its nodes/<node>/status.json (its
attempt, its ranks, the workers that failed there); the job's supervisor (node rank 0) reads them
to name the node and rank that failed first, and the others read the job's top-level status.json
to start an attempt after the job's supervisor has (it hosts the rendezvous) and to end with it.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Callable

from mt.contract.paths import RunPaths
from mt.contract.status import Status, read_status
from tui.cluster.preempt import restart_count
from tui.read.nodes import JobReader
from tui.read.wait import poll_until

JOB_START_WAIT_S = 120.0  # a node waits this long for the job's supervisor to start an attempt
JOB_END_WAIT_S = 60.0     # ... and, once its own part is over, for the job's supervisor to record the end
PEER_WAIT_S = 20.0        # the job's supervisor waits this long for the other nodes to report a failed attempt
_POLL_S = 0.2


class PeerNodes:
    """The other nodes' statuses, as this node's supervisor reads them (never writes them), through
    the job's one reader of nodes/ (the one the rules' ticks poll too)."""

    def __init__(self, paths: RunPaths, job: JobReader, log: logging.Logger) -> None:
        self.paths = paths
        self.job = job
        self.log = log

    def wait_for_job_attempt(self, attempt: int, timeout_s: float) -> bool:
        """Until the job's supervisor has started `attempt` (its torchrun hosts the rendezvous, and
        starting first gives the first node the lower ranks where nodes share a host name)."""
        def seen() -> str:
            st = read_status(self.paths.root)
            if (st.attempt or 0) > attempt or (st.attempt == attempt and st.torchrun_pid and st.state != "starting"):
                return "started"
            if st.is_final and (st.attempt or 0) >= attempt - 1 and not _before_this_run(st):
                return "ended"   # the job ended without this attempt
            return ""
        return poll_until(seen, timeout_s, _POLL_S) == "started"

    def wait_for_job_end(self, timeout_s: float) -> None:
        """Until the job's status.json is final (or `timeout_s`)."""
        poll_until(lambda: read_status(self.paths.root).is_final, timeout_s, _POLL_S)

    def wait_for_attempt_end(self, attempt: int, timeout_s: float, each: Callable[[], bool] = lambda: False) -> None:
        """Until every other node has recorded the end of `attempt` (its failures with it); `each` runs
        every poll meanwhile (the rules and Slurm's word go on: a lost node never reports) and ends
        the wait when it returns True."""
        start = time.monotonic()
        while True:
            waiting = [v.name for v in self.job.poll() if v.name != self.paths.node and not _attempt_over(v.status, attempt)]
            if not waiting or time.monotonic() > start + timeout_s or each():
                break
            time.sleep(_POLL_S)
        if waiting:
            self.log.warning("attempt %d: no end reported by node %s in %.1f s", attempt, ", ".join(waiting), time.monotonic() - start)

    def killed_elsewhere(self, attempt: int | None) -> str:
        """`rank 1 on node n2 was killed by signal 9 (SIGKILL)` for the first such failure on another
        node (as the job's reader last read them), else ""."""
        for e in self.job.exits(attempt, but=self.paths.node):
            for f in e.failures:
                if f.exit_code is not None and f.exit_code < 0:
                    try:
                        name = f" ({signal.Signals(-f.exit_code).name})"
                    except ValueError:
                        name = ""
                    return f"rank {f.rank} on node {f.node} was killed by signal {-f.exit_code}{name}"
        return ""


def next_attempt(status: Status, is_job: bool) -> int:
    """The attempt this supervisor runs, from the job's status as it read it: the next one, except
    on a job's other node when the job's supervisor has already begun that attempt in this Slurm
    run (it starts first; a node that read its status a moment later must join, not wait for one more)."""
    attempt = (status.attempt or 0) + 1
    if is_job or status.attempt is None:
        return attempt
    newest = status.attempts[-1] if status.attempts else {}
    begun = status.state == "starting" or (
        status.state in ("running", "stopping") and newest.get("attempt") == status.attempt
        and newest.get("ended") is None and newest.get("slurm_restart") == restart_count(os.environ))
    return status.attempt if begun else attempt


def _before_this_run(st: Status) -> bool:
    """The job's status was written in an earlier Slurm run of the job (a requeue, by anyone, that its
    supervisor recorded as an end, or did not see): its job's supervisor has yet to write this run's."""
    newest = st.attempts[-1] if st.attempts else {}
    restart = newest.get("slurm_restart")
    return isinstance(restart, int) and restart < restart_count(os.environ)


def _attempt_over(st: Status, attempt: int) -> bool:
    """A node's status shows `attempt` ended (or a later one, or the node's end)."""
    if st.is_final or (st.attempt or 0) > attempt:
        return True
    return st.attempt == attempt and any(a.get("attempt") == attempt and a.get("ended") is not None for a in st.attempts)

