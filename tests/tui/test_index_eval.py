"""A big run's quick read (the index's tail and the newest record of each kind) keeps an eval's
[eval] factory numbers and val_loss when the eval is older than the tail (mt ls, a first frame)."""
from __future__ import annotations

from pathlib import Path

from mt.contract.eventlog import EventWriter
from mt.contract.events import SCHEMA
from mt.contract.paths import RunPaths
from tui.read.index_tail import TAIL_RECORDS, quick_read_index


def test_an_eval_with_metrics_older_than_the_tail_is_read_from_its_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    events = EventWriter(RunPaths(run).events)
    events.emit("eval", **{**{f.name: None for f in SCHEMA["eval"]}, "step": 5, "val_loss": 1.25, "metrics": {"accuracy": 0.75}})
    for step in range(6, 6 + TAIL_RECORDS + 100):   # the eval falls out of the tail
        events.emit("step", **{**{f.name: None for f in SCHEMA["step"]}, "step": step, "loss": 2.0, "lr": 1e-3})
    quick = quick_read_index(run)
    assert quick is not None
    st = quick.state
    assert (st.val_loss, st.val_loss_step) == (1.25, 5)
    assert st.evals.metrics == {"accuracy": 0.75} and st.evals.metrics_step == 5
