"""Which attempt a job's other node joins: it may read the job's status just after the job's
supervisor began the attempt (a 2-node job once waited 120 s for an attempt 2 that never came)."""
from __future__ import annotations

import pytest

from mt.contract.status import Status
from tui.run.peers import next_attempt


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
