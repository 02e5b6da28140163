"""`mt launch --slurm` checks devices where the ranks run (issue 31 item 1): never on the login node,
whose GPUs are not the job's; each node's supervisor refuses, naming its node, before torchrun starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import MT, REPO, write_preset
from tui.supervise.launch import Overrides, create_run


def _cuda_preset(tmp_path: Path) -> Path:
    return write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"device": "cuda", "nproc_per_node": 2})


def test_the_login_node_without_gpus_does_not_refuse_a_cuda_job(tmp_path: Path) -> None:
    # this machine has no GPU: as a login node it must still write the job (its nodes have the GPUs)
    done = subprocess.run([*MT, "launch", str(_cuda_preset(tmp_path)), "--slurm", "--dry-run"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "tui.supervise.supervisor_main" in done.stdout and "--slurm" in done.stdout


@pytest.mark.slow
def test_a_node_without_the_gpus_fails_the_run_naming_itself_before_torchrun(tmp_path: Path) -> None:
    run = create_run(_cuda_preset(tmp_path), Overrides(), slurm=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(SLURMD_NODENAME="gpu-7", SLURM_NNODES="1", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-P", "-m", "tui.supervise.supervisor_main", "--run-dir", str(run), "--slurm"],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 1, done.stderr
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed"
    assert status["reason"].startswith("node gpu-7: launch.device:") and "no NVIDIA GPU" in status["reason"]
    assert not (run / "logs" / "torchrun.log").exists()  # no rank was started to find out
