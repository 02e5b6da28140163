"""`[checkpoint] keep_best`: an overfitting run keeps its best checkpoint beside keep_last's, marks it,
and a kill and a resume keep and mark the same one (the marking is derived from the manifests)."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from mt.contract import checkpoints
from tests.engine.runner import events, make_run, run_engine
from tui.read.follower import load_run_state
from tui.report.runs import run_summary, runs_table
from tui.widgets.header import render_header

EVERY = 10
STEPS = 150


def overfitting_run(root: Path, **checkpoint: object) -> Path:
    """A small GPT on 600 random letters: validation loss falls to the letters' entropy, then rises
    as the model memorizes the training part (measured: best near step 40, worse from step 60 on)."""
    corpus = root / "letters.txt"
    rng = random.Random(0)
    corpus.write_text("".join(rng.choice("abcdefghijklmnop") for _ in range(600)))
    return make_run(root, "overfit", data={"source": "text", "path": str(corpus), "val_fraction": 0.3},
                    model={"vocab_size": 256, "n_layer": 2, "n_head": 2, "d_model": 128, "seq_len": 32},
                    train={"max_steps": STEPS, "lr": 3e-3, "min_lr": 3e-3, "warmup_steps": 0, "schedule": "constant",
                           "eval_every": EVERY, "eval_batches": 4, "grad_accum_steps": 1, "micro_batch_size": 16,
                           "grad_clip": 0.0, "weight_decay": 0.0},
                    checkpoint={"every_steps": EVERY, "keep_last": 1, "keep_best": 1, **checkpoint})


def best_eval(run: Path) -> tuple[int, float]:
    """The step and val_loss of the run's lowest eval (the first of equals), and that the run overfit."""
    evals = {e["step"]: e["val_loss"] for e in events(run, "eval")}
    step = min(evals, key=lambda s: (evals[s], s))
    assert step < STEPS and evals[STEPS] > evals[step], f"the run did not overfit: {evals}"
    return step, evals[step]


def on_disk(run: Path) -> list[int]:
    return sorted(s for s, _ in checkpoints.folders(run / "checkpoints"))


@pytest.mark.slow
def test_best_checkpoint_survives_keep_last_and_a_kill_and_resume(tmp_path: Path) -> None:
    run = overfitting_run(tmp_path)
    # attempt 1 is SIGKILLed while it writes step 110's checkpoint (after its first file)
    faults = json.loads((run / "config.json").read_text())
    faults["faults"]["crash_in_checkpoint_at_step"] = 110
    (run / "config.json").write_text(json.dumps(faults))
    assert run_engine(run) != 0
    killed_at = on_disk(run)[-1]
    assert killed_at == 100 and any(p.name.startswith(".tmp-step-110") for p in (run / "checkpoints").iterdir())
    assert run_engine(run, attempt=2) == 0, (run / "launcher-2.log").read_text()

    step, value = best_eval(run)
    # keep_last = 1 keeps the newest; keep_best = 1 keeps the best, which retention would have deleted
    assert on_disk(run) == sorted({step, STEPS})
    manifest = checkpoints.read_manifest(run / "checkpoints" / f"step-{step}")
    assert manifest["best"] == {"metric": "val_loss", "mode": "min", "value": value, "keep": 1}
    assert [(b.step, b.value) for b in checkpoints.best(run / "checkpoints")] == [(step, value)]
    # the engine's checkpoint events after the resume mark it too (a restart derives it from the manifests)
    after = [e for e in events(run, "checkpoint") if e["step"] > killed_at]
    assert after and all(e["best"] == {str(step): value} and e["best_metric"] == "val_loss" for e in after)
    assert f"best checkpoint: @{step} val_loss" in run_summary(run)
    table = runs_table(tmp_path)
    assert "BEST CKPT" in table and f"@{step} val_loss" in table
    assert f"best ckpt @{step}" in render_header(load_run_state(run), time.time(), 240, 0.0, False).plain   # the dashboard's


@pytest.mark.slow
def test_best_by_an_eval_number_that_is_higher_when_better(tmp_path: Path) -> None:
    """best_mode = "max": the highest val_loss is the "best" (a metric where more is better), so the
    newest checkpoints (the most overfit) win and the early ones are pruned."""
    run = overfitting_run(tmp_path, best_mode="max", keep_best=2)
    assert run_engine(run) == 0, (run / "launcher-1.log").read_text()
    evals = {e["step"]: e["val_loss"] for e in events(run, "eval")}
    top = sorted(evals, key=lambda s: (-evals[s], s))[:2]
    assert on_disk(run) == sorted(set(top) | {STEPS})
    last = events(run, "checkpoint")[-1]
    assert list(last["best"]) == [str(s) for s in top]   # best first
    assert json.loads((run / "checkpoints" / f"step-{top[0]}" / "manifest.json").read_text())["best"]["mode"] == "max"
    # resumed with keep_best = 0 (and 10 more steps): the next save's manifest has no `best`, so none is kept
    config = json.loads((run / "config.json").read_text())
    config["checkpoint"]["keep_best"], config["train"]["max_steps"] = 0, STEPS + EVERY
    (run / "config.json").write_text(json.dumps(config))
    assert run_engine(run, attempt=2) == 0, (run / "launcher-2.log").read_text()
    assert on_disk(run) == [STEPS + EVERY] and checkpoints.best(run / "checkpoints") == []
    assert "best" not in events(run, "checkpoint")[-1]
