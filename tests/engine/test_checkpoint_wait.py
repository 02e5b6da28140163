"""While rank 0 alone writes a full checkpoint the other ranks wait on the host group, whose timeout no
checkpoint size reaches (issue 31 item 3): a write slower than pg_timeout_s ends no rank."""
from __future__ import annotations

import pytest

from .runner import events, logs, make_run, run_engine


@pytest.mark.slow
def test_a_checkpoint_slower_than_pg_timeout_ends_no_rank(tmp_path):
    # the write takes twice pg_timeout_s (slow_checkpoint_s, after its first file): as a large model on slow storage
    pg_timeout = 15.0
    run = make_run(tmp_path, launch={"nproc_per_node": 2, "pg_timeout_s": pg_timeout},
                   train={"max_steps": 4}, faults={"slow_checkpoint_s": 2 * pg_timeout})
    assert run_engine(run, nproc=2, timeout=300) == 0, logs(run)
    saved = events(run, "checkpoint")
    assert [c["step"] for c in saved] == [4] and saved[0]["seconds"] >= 2 * pg_timeout
    assert events(run, "run_end")[0]["status"] == "completed"
