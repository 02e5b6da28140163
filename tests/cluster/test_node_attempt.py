"""Which attempt a job's other node joins: it may read the job's status just after the job's
supervisor began the attempt (a 2-node job once waited 120 s for an attempt 2 that never came)."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from mt.contract.paths import RunPaths
from mt.contract.status import Status, read_status, write_status
from tui.cluster.peers import PeerNodes, next_attempt
from tui.read.nodes import JobReader


def test_a_fresh_job_starts_attempt_one_on_every_node() -> None:
    assert next_attempt(Status(state="pending"), is_job=True) == 1
    assert next_attempt(Status(state="pending"), is_job=False) == 1


def test_the_other_node_joins_the_attempt_the_job_just_began() -> None:
    begun = Status(state="starting", attempt=1)
    assert next_attempt(begun, is_job=False) == 1
    assert next_attempt(begun, is_job=True) == 2   # the job's own supervisor never reads its own start


@pytest.mark.parametrize("restart, joins", [("1", 2), ("2", 3)])
def test_a_running_attempt_is_joined_only_if_it_began_in_this_slurm_run(monkeypatch, restart, joins) -> None:
    # attempt 2 began under restart 1; an older allocation's attempt left `running` is not this one
    monkeypatch.setenv("SLURM_RESTART_COUNT", restart)
    st = Status(state="running", attempt=2, attempts=[{"attempt": 2, "ended": None, "slurm_restart": 1}])
    assert next_attempt(st, is_job=False) == joins


def test_after_a_requeue_both_nodes_take_the_next_attempt(monkeypatch) -> None:
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    st = Status(state="pending", attempt=1, attempts=[{"attempt": 1, "ended": 5.0, "slurm_restart": 0}])
    assert next_attempt(st, is_job=False) == 2 and next_attempt(st, is_job=True) == 2


def test_a_job_status_ended_in_an_earlier_slurm_run_does_not_turn_the_other_node_away(monkeypatch: pytest.MonkeyPatch,
                                                                                        tmp_path: Path) -> None:
    """`scontrol requeue` by hand recorded as an end (`stopped`) by the old allocation's supervisor: the
    other node of the requeued job waits for the job's supervisor to begin attempt 2 (it gave up at once:
    'the job's supervisor did not start attempt 2 in 120 s'), and joins it once begun."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    paths = RunPaths(tmp_path)
    write_status(paths, Status(state="stopped", attempt=1, attempts=[{"attempt": 1, "ended": 5.0, "slurm_restart": 0}]))
    peers = PeerNodes(RunPaths(tmp_path, "n2"), JobReader(tmp_path), logging.getLogger("test"))
    attempt = next_attempt(read_status(tmp_path), is_job=False)
    assert attempt == 2

    def begin() -> None:   # the job's supervisor of the requeued job, a moment later
        time.sleep(1.0)
        write_status(paths, Status(state="running", attempt=2, torchrun_pid=4242,
                                   attempts=[{"attempt": 1, "ended": 5.0, "slurm_restart": 0},
                                             {"attempt": 2, "ended": None, "slurm_restart": 1}]))

    job = threading.Thread(target=begin)
    job.start()
    t0 = time.monotonic()
    joined = peers.wait_for_job_attempt(attempt, timeout_s=30)
    job.join()
    assert joined and time.monotonic() - t0 >= 0.9
    # the same status written in this Slurm run (restart 1) does mean the job ended without attempt 2
    write_status(paths, Status(state="failed", attempt=1, attempts=[{"attempt": 1, "ended": 5.0, "slurm_restart": 1}]))
    assert peers.wait_for_job_attempt(2, timeout_s=30) is False
