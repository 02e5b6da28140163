"""[eval]'s samples and factory numbers in the mirrors (TensorBoard, W&B offline) and `mt export`,
over a synthetic run directory read back with each tool's own reader."""
from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest

from mt.contract.preset import config_from_dict
from tests.cli.conftest import mt
from tests.mirror.tbread import assert_mirrors, texts
from tests.tui.synth import SynthRun
from tui.mirror.mirror import export_tensorboard, open_wandb, save_states

TRICKY = "line one\nx = *not bold* <b>"


def _run(root: Path) -> SynthRun:
    """Ten steps, an eval with metrics and two samples at 5 and at 10."""
    run = SynthRun(root)
    run.run_start()
    for s in range(1, 11):
        run.step(s)
        if s % 5 == 0:
            run.event("eval", step=s, val_loss=2.0, metrics={"accuracy": s / 10, "pass_rate": 0.5})
            run.event("sample", step=s, index=0, prompt="Once", text=f" upon step {s}", tokens=3)
            run.event("sample", step=s, index=1, prompt="Q:", text=TRICKY, tokens=7)
    run.flush()
    return run


def test_tensorboard_holds_the_eval_metrics_and_the_samples_as_text(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    run = _run(tmp_path / "run")
    export_tensorboard(run.paths, tmp_path / "tb")
    got = assert_mirrors(tmp_path / "tb", run.paths.events)   # every tag equal to events.jsonl's
    assert got["metrics/eval/accuracy"] == [(5, 0.5), (10, 1.0)]
    shown = texts(tmp_path / "tb")
    assert "**Once** upon step 5" in shown and "**Once** upon step 10" in shown
    assert any("line one  \nx = \\*not bold\\* \\<b\\>" in t for t in shown), shown  # markdown shows it as written


def test_wandb_holds_the_eval_metrics_and_the_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    from tests.mirror.wbread import offline_runs, series

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    run = _run(tmp_path / "run")
    cfg = config_from_dict({"run": {"name": "w"}, "monitor": {"wandb": {"project": "mt-test"}}}, "test.toml")
    mirror = open_wandb(run.paths, cfg, run.paths.mirror, logging.getLogger("test"))
    try:
        mirror.poll()
        save_states(run.paths.mirror, {"wandb": mirror})
    finally:
        mirror.close()
    runs = offline_runs(tmp_path / "run" / "wandb")
    assert series(runs, "metrics/eval/accuracy") == [(5, 0.5), (10, 1.0)]
    assert [(s, t) for s, t in series(runs, "samples/0")] == [(5, "**Once** upon step 5"), (10, "**Once** upon step 10")]


def test_export_csv_has_the_metrics_columns_and_a_row_per_sample(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    out = tmp_path / "run.csv"
    r = mt("export", run.root, "--csv", out)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    evals = [row for row in rows if row["kind"] == "eval"]
    assert [(row["step"], row["metrics/eval/accuracy"]) for row in evals] == [("5", "0.5"), ("10", "1.0")]
    samples = [row for row in rows if row["kind"] == "sample"]
    assert [(row["step"], row["index"], row["prompt"], row["tokens"]) for row in samples] == [
        ("5", "0", "Once", "3"), ("5", "1", "Q:", "7"), ("10", "0", "Once", "3"), ("10", "1", "Q:", "7")]
    assert samples[1]["text"] == TRICKY  # a quoted cell keeps the newline
