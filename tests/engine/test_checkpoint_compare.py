"""`python -P -m engine.checkpoint.compare`: two checkpoint folders' tensors, bit for bit, in the
model's order; and which of a run's checkpoints belong to the steps it kept."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.checkpoint import full
from tests.engine.runner import REPO
from tui.report.divergence import usable_checkpoints
from tui.state.runseries import RunSeries


def _save(root: Path, step: int, model: dict[str, torch.Tensor]) -> Path:
    parts = {"model.pt": model, "optim.pt": {"optimizer": {}, "scaler": {}}, "train.pt": {"step": step}}
    return full.save(root, step, parts, {"world_size": 1}).path


def _compare(a: Path, b: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-P", "-m", "engine.checkpoint.compare", str(a), str(b)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow   # three processes that import torch
def test_only_the_tensors_that_differ_in_bits_in_the_models_order(tmp_path: Path) -> None:
    base = {"z.first": torch.arange(6.0), "b.second": torch.ones(2, 3), "a.third": torch.tensor([1.0, float("nan")]),
            "y.fourth": torch.zeros(4), "steps": torch.tensor(3)}
    other = {k: v.clone() for k, v in base.items()}
    other["b.second"][1, 2] = 1.5                  # one value
    other["y.fourth"][0] = -0.0                    # equal as a number, another bit pattern
    other["steps"] += 2                            # integers too
    # a.third's NaN is the same NaN in both: identical
    a, b = _save(tmp_path / "a", 2, base), _save(tmp_path / "b", 2, other)
    code, out = _compare(a, b)
    assert code == 0, out
    assert [(d["name"], d["max_abs_diff"], d["values_differ"], d["values"]) for d in out["differ"]] == [
        ("b.second", 0.5, 1, 6), ("y.fourth", 0.0, 1, 4), ("steps", 2.0, 1, 1)]   # the file's order, not by name
    assert out["tensors"] == 5 and out["only_a"] == out["only_b"] == out["mismatched"] == []

    del other["z.first"]
    other["extra"], other["a.third"] = torch.ones(1), torch.ones(3)
    code, out = _compare(a, _save(tmp_path / "c", 2, other))
    assert (out["only_a"], out["only_b"], out["mismatched"]) == (["z.first"], ["extra"], ["a.third"])

    # a file whose bytes no longer match the manifest is never loaded
    model = b / "model.pt"
    data = bytearray(model.read_bytes())
    data[-50] ^= 1
    model.write_bytes(bytes(data))
    code, out = _compare(a, b)
    assert code == 2 and out == {"error": f"{model}: sha256 mismatch (corrupted)"}


def test_a_checkpoint_of_an_abandoned_timeline_is_not_used(tmp_path: Path) -> None:
    """A run that went back to step 2 after writing step-4 (a resume from an older checkpoint, a
    rollback) and never rewrote step-4: that folder holds steps the run no longer has."""
    root = tmp_path / "run" / "checkpoints"
    root.parent.mkdir()
    for step in (2, 4):
        _save(root, step, {"w": torch.ones(1)})
    series = RunSeries()
    series.rewinds = [(time.time() - 3600, 0)]           # the first attempt, before both were written
    assert sorted(usable_checkpoints(tmp_path / "run", series)) == [2, 4]
    series.rewinds.append((time.time() + 1, 2))          # back to step 2 after both were written
    assert sorted(usable_checkpoints(tmp_path / "run", series)) == [2]
