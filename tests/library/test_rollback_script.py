"""`mt rollback` on a script's run: the rollback reaches the script through `run.resume_from`,
`run.skip_batches` and `run.lr_scale` (docs/library.md#rollback); examples/script/train.py applies them."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import REPO, events, mt, run_dir_from, status

EXAMPLE = REPO / "examples" / "script" / "train.py"


@pytest.mark.slow
def test_a_script_rolls_back_to_its_reported_checkpoint_skipping_batches_with_its_lr_scaled(tmp_path: Path) -> None:
    first = mt("launch", EXAMPLE, "--nproc", "1", "--runs-dir", tmp_path / "runs", "--name", "s", "--headless", "--",
               "--steps", "30", "--save-every", "10", "--batch", "4", "--seq", "8", cwd=tmp_path)
    run_dir = run_dir_from(first.stdout)
    assert status(run_dir)["state"] == "completed", first.stdout + first.stderr
    old = {e["step"]: e for e in events(run_dir, "step")}
    bad = mt("rollback", run_dir, "--to", "5", "--detach")   # the script reported 10, 20, 30 only
    assert bad.returncode == 2 and "no intact checkpoint at or before step 5" in bad.stderr and not events(run_dir, "rollback")

    res = mt("rollback", run_dir, "--to", "15", "--skip-batches", "5", "--lr-scale", "0.5", "--headless", timeout=300)
    assert res.returncode == 0 and status(run_dir)["state"] == "completed", res.stdout + res.stderr
    [rb] = events(run_dir, "rollback")
    assert (rb["to_step"], rb["skip_batches"], rb["lr_scale"], rb["by"], rb["count"]) == (10, 5, 0.5, "user", 1)
    start = [e for e in events(run_dir, "run_start") if e["attempt"] == 2][0]
    assert start["resumed_from"]["path"].endswith("step10.pt")
    new = [e for e in events(run_dir, "step") if e["t"] > start["t"]]
    assert [e["step"] for e in new] == list(range(11, 31))
    assert all(e["lr"] == pytest.approx(0.5 * old[e["step"]]["lr"], rel=1e-9) for e in new)
    assert new[0]["loss"] != old[11]["loss"]   # other data (batch 16's) and another lr
    assert not (run_dir / "rollback.json").exists()  # spent by the script's first checkpoint after it


@pytest.mark.parametrize(("skip", "lr", "refused"), [(3, None, True), (0, 0.5, True), (0, None, False)])
def test_the_trainer_adapters_go_back_to_the_checkpoint_and_refuse_a_skip_or_an_lr_scale_in_one_line(
        tmp_path: Path, skip: int, lr: float | None, refused: bool) -> None:
    """HF's and Lightning's callbacks (LazyRun) hand the Trainer the rolled-back checkpoint; a Trainer
    cannot skip batches nor scale its scheduled lr from outside, so asking for either is refused."""
    import json
    import os
    import subprocess
    import sys

    from mt.contract.events import dumps, make_event

    run = tmp_path / "run"
    (run / "ckpt").mkdir(parents=True)
    lines = []
    for step in (10, 20):
        (run / "ckpt" / f"step{step}").mkdir()
        lines.append(dumps(make_event("checkpoint", step=step, path=str(run / "ckpt" / f"step{step}"), bytes=1, seconds=0.1,
                                      reason="script", request_id=None)))
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    (run / "rollback.json").write_text(json.dumps({"step": 25, "to_step": 15, "skip_batches": skip, "lr_scale": lr,
                                                  "why": "to step 15", "by": "user", "count": 1}))
    code = ("import mt\nfrom mt.integrations.lazyrun import LazyRun\nrun = mt.init()\n"
            "print(run.skip_batches, run.lr_scale)\nprint(LazyRun(run).resume_from)\n")
    env = {**os.environ, "MT_RUN_DIR": str(run), "MT_ATTEMPT": "2", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    if refused:
        assert res.returncode == 1 and "cannot skip batches or scale the lr" in res.stderr.strip().splitlines()[-1], res.stderr
    else:
        assert res.returncode == 0 and res.stdout.splitlines()[-1] == str(run / "ckpt" / "step10"), res.stdout + res.stderr
