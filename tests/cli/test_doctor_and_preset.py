"""`mt doctor` on this machine, and the shipped tiny preset end to end."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, events, mt, run_dir_from, status
from tests.cli.test_startup import _probe

pytestmark = pytest.mark.slow


def test_doctor_checks_torch_and_a_gloo_group_without_importing_torch_itself() -> None:
    res = _probe("doctor")
    assert "TORCH_FREE" in res.stderr, res.stderr
    lines = res.stdout.splitlines()
    assert any(l.startswith("ok ") and "torch 2." in l for l in lines), lines
    assert any("2-process gloo group starts" in l for l in lines), lines
    assert any("NVML" in l or "GPU " in l for l in lines), lines
    failed = [l for l in lines if l.startswith("FAIL")]
    assert res.stderr.strip().endswith(f"TORCH_FREE {1 if failed else 0}"), (lines, res.stderr)


@pytest.mark.skipif(os.environ.get("MT_TEST_TINY") != "1",
                    reason="1-3 min on 2 cores: over the suite's time budget; set MT_TEST_TINY=1")
def test_real_tiny_preset_completes(tmp_path: Path) -> None:
    preset = REPO / "presets" / "tiny-cpu.toml"
    res = mt("launch", preset, "--headless", "--runs-dir", tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    run_dir = run_dir_from(res.stdout)
    assert status(run_dir)["state"] == "completed"
    cfg = json.loads((run_dir / "config.json").read_text())
    end = events(run_dir, "run_end")[-1]
    assert end["status"] == "completed" and end["step"] == cfg["train"]["max_steps"]
    losses = [e["loss"] for e in events(run_dir, "step")]
    assert losses[-1] < losses[0]  # it learns
    assert [e["step"] for e in events(run_dir, "eval")]
