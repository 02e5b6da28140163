"""A script reporting metrics with its checkpoints (`run.checkpoint_saved(path, step, metrics=...)`)
gets the engine's marking of the best ones, also across a restart that joins the same run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mt.contract.jsonl import read_events
from tests.cli.conftest import REPO
from tui.report.runs import run_summary, runs_table

SCRIPT = '''
import sys, mt
first, last, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
run = mt.init(runs_dir=sys.argv[4], name="scored")
print(run.dir, flush=True)
for step in range(first, last + 1):
    run.step(step, loss=1.0)
    path = run.dir / f"ckpt-{step}.txt"
    path.write_text(str(step))
    run.checkpoint_saved(path, step, metrics={"val_loss": (step - 4) ** 2 + 1.0, "acc": step / 10},
                         best_metric="val_loss" if mode == "min" else "acc", best_mode=mode, keep_best=2)
run.finish()
'''


def script(tmp_path: Path, first: int, last: int, mode: str, env: dict[str, str] | None = None) -> Path:
    (tmp_path / "scored.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(tmp_path / "scored.py"), str(first), str(last), mode, str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def test_a_scripts_best_checkpoints_are_marked_across_a_restart(tmp_path: Path) -> None:
    run = script(tmp_path, 1, 6, "min")
    # the next attempt joins the same run directory, as the supervisor's restart does, with worse numbers
    assert script(tmp_path, 7, 9, "min", {"MT_RUN_DIR": str(run), "MT_ATTEMPT": "2"}) == run
    last = [e for e in read_events(run / "events.jsonl") if e["kind"] == "checkpoint"][-1]
    assert last["step"] == 9 and last["best"] == {"4": 1.0, "3": 2.0} and last["best_metric"] == "val_loss"
    assert last["metrics"] == {"val_loss": 26.0, "acc": 0.9}
    assert "best checkpoints: @4 val_loss 1, @3 2" in run_summary(run)
    assert "@4 val_loss 1, @3 2" in runs_table(tmp_path / "runs")


def test_higher_is_better_and_a_deleted_checkpoint_is_not_marked(tmp_path: Path) -> None:
    run = script(tmp_path, 1, 5, "max")
    (run / "ckpt-5.txt").unlink()   # the script's own retention removed it: no longer a checkpoint to mark
    script(tmp_path, 6, 6, "max", {"MT_RUN_DIR": str(run), "MT_ATTEMPT": "2"})
    last = [e for e in read_events(run / "events.jsonl") if e["kind"] == "checkpoint"][-1]
    assert last["best"] == {"6": 0.6, "4": 0.4} and last["best_metric"] == "acc"
