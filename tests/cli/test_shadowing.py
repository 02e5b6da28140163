"""mt's processes run mt's code whatever the working directory holds (torchvision's scripts have an engine.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.cli.conftest import events, run_cmd, status, write_preset

pytestmark = pytest.mark.slow
MT_SCRIPT = Path(sys.executable).parent / "mt"


@pytest.mark.skipif(not MT_SCRIPT.exists(), reason="needs the installed mt script")
def test_launch_from_a_folder_with_its_own_engine_tui_and_mt(tmp_path: Path) -> None:
    work = tmp_path / "user-project"
    work.mkdir()
    for name in ("engine.py", "mt.py", "torch.py"):
        (work / name).write_text("raise SystemExit('the user module was imported instead of the real one')\n")
    (work / "tui").mkdir()
    (work / "tui" / "__init__.py").write_text("raise SystemExit('the user tui was imported')\n")
    write_preset(work / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 2}, train={"max_steps": 6})
    res = run_cmd([str(MT_SCRIPT), "launch", "p.toml", "--headless"], 240, cwd=work, runs_dir=tmp_path / "runs")
    assert (tmp_path / "runs").is_dir(), res.stdout + res.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    logs = "".join(p.read_text(errors="replace") for p in run_dir.glob("logs/*.log"))
    assert res.returncode == 0, res.stdout + res.stderr + logs
    assert status(run_dir)["state"] == "completed"
    assert events(run_dir, "run_end")[-1]["status"] == "completed"
    assert "user module was imported" not in logs and "user tui" not in logs


USER_SCRIPT = """
import engine                      # the user's own engine.py, next to this script
assert engine.WHOSE == "the user's", engine.__file__
import torch.distributed as dist
dist.init_process_group("gloo")    # unconditional, as most scripts and the HF Trainer do
import mt
run = mt.init(runs_dir="unused")
for step in range(1, 4):
    run.step(step, loss=1.0 / step, lr=1e-3)
run.finish()
dist.destroy_process_group()
"""


@pytest.mark.skipif(not MT_SCRIPT.exists(), reason="needs the installed mt script")
def test_a_one_process_script_imports_its_own_engine_py(tmp_path: Path) -> None:
    # one process runs without torchrun, through mt's engine.direct: it must leave `engine` to the user
    work = tmp_path / "user-project"
    work.mkdir()
    (work / "engine.py").write_text("WHOSE = \"the user's\"\n")
    (work / "train.py").write_text(USER_SCRIPT)
    res = run_cmd([str(MT_SCRIPT), "launch", "train.py", "--nproc", "1", "--headless", "--runs-dir", str(tmp_path / "runs")],
                  240, cwd=work, runs_dir=tmp_path / "runs")
    run_dir = next((tmp_path / "runs").iterdir())
    logs = "".join(p.read_text(errors="replace") for p in run_dir.glob("logs/*.log"))
    assert res.returncode == 0, res.stdout + res.stderr + logs
    assert status(run_dir)["state"] == "completed"
    assert [e["step"] for e in events(run_dir, "step")] == [1, 2, 3]
