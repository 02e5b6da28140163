"""The W&B mirror over synthetic run directories (no training), offline, read back with wandb's own
reader: every row that should be there is, with its value; two supervisors, one W&B run id."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from mt.contract.preset import config_from_dict
from tests.mirror.wbread import offline_runs, series
from tests.tui.synth import SynthRun, loss_at
from tui.mirror.mirror import open_wandb, save_states

pytest.importorskip("wandb")


def _supervise(run: SynthRun, table: dict[str, object]) -> None:
    """What one supervisor's W&B mirror does with what the run directory holds now: poll, save, close."""
    run.flush()
    cfg = config_from_dict({"run": {"name": "w"}, "monitor": {"wandb": table}}, "test.toml")
    mirror = open_wandb(run.paths, cfg, run.paths.mirror, logging.getLogger("test"))
    try:
        mirror.poll()
        save_states(run.paths.mirror, {"wandb": mirror})
    finally:
        mirror.close()
    assert not mirror.sink.failed.is_set()


def _steps(run: SynthRun, first: int, last: int) -> None:
    for s in range(first, last + 1):
        run.step(s)
        if s % 25 == 0:
            run.event("eval", step=s, val_loss=loss_at(s) + 0.1)


@pytest.mark.parametrize("every", [None, 10])
def test_thinned_or_not_every_row_that_should_be_there_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int | None) -> None:
    """Steps 1-60 (an eval every 25, a script's run.log at 33, a crash) by one supervisor, 61-80 by
    the next: the training rows at every `every_steps`th step (all without the key), evals, the
    script's metrics and the incident always, each value equal to events.jsonl's."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)   # the offline files go into the run directory
    table: dict[str, object] = {"project": "mt-test", **({"every_steps": every} if every else {})}
    run = SynthRun(tmp_path / "run")
    run.run_start()
    _steps(run, 1, 33)
    run.event("metrics", step=33, values={"ppl": 2.5})
    _steps(run, 34, 60)
    run.paths.incidents.write_text(json.dumps({"t": run.t, "code": "crash", "severity": "error", "step": 60, "title": "Rank 0 crashed",
                                               "detail": "RuntimeError", "advice": "see logs", "status": "open", "source": "supervisor"}) + "\n")
    _supervise(run, table)
    _steps(run, 61, 80)
    time.sleep(1.1)   # wandb names an offline run's folder by the second it started in: a second one, as `mt resume` is
    _supervise(run, table)

    runs = offline_runs(tmp_path / "run" / "wandb")
    kept = json.loads(run.paths.mirror.read_text())["wandb"]["sink"]["id"]
    assert len(runs) == 2 and {r.run_id for r in runs} == {kept}
    n = every or 1
    assert series(runs, "train/loss") == [(s, loss_at(s)) for s in range(1, 81) if s % n == 0]
    assert series(runs, "train/lr") == [(s, 1e-3 * min(1.0, s / 10)) for s in range(1, 81) if s % n == 0]
    assert series(runs, "val/loss") == [(s, loss_at(s) + 0.1) for s in (25, 50, 75)]
    assert series(runs, "metrics/ppl") == [(33, 2.5)]
    (crash,) = series(runs, "incidents/crash")
    assert "Rank 0 crashed" in crash[1] and crash[0] == 60   # at the newest step logged
