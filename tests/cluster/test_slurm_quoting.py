"""A Slurm run whose run directory holds spaces, quotes, `$`, `#` and `%j`: sbatch reads job.sh's
#SBATCH --output as the very path, the batch shell hands the supervisor the very --run-dir, and the
job runs to completion (issue #34 item 4: every value that reaches a shell or a batch script quoted)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import events, run_dir_from, status, write_preset
from tests.cluster.conftest import Cluster
from tests.cluster.test_slurm_launch import _mt


@pytest.mark.slow
def test_a_run_dir_with_shell_and_sbatch_characters_runs_under_slurm(slurm: Cluster, tmp_path: Path) -> None:
    runs = tmp_path / "my runs 'q' \"dq\" $HOME #x %j"
    preset = write_preset(tmp_path / "p.toml", runs, launch={"nproc_per_node": 1},
                          train={"max_steps": 4, "warmup_steps": 1}, checkpoint={"every_steps": 2})
    done = _mt("launch", preset, "--slurm", env=slurm.env)
    assert done.returncode == 0, done.stderr
    run_dir = run_dir_from(done.stdout)
    assert run_dir.parent == runs.resolve(), done.stdout
    job = status(run_dir)["slurm_job_id"]
    final = slurm.wait_for("the run to end", lambda: status(run_dir)["state"] in
                           ("completed", "failed", "killed", "stopped") and status(run_dir), timeout=120)
    assert final["state"] == "completed", (run_dir / "logs" / "supervisor.log").read_text()
    assert [e["step"] for e in events(run_dir, "step")] == [1, 2, 3, 4]
    slurm.wait_for("the job to leave the queue", lambda: slurm.state(job) == "" or None, timeout=30)
    # sbatch split the #SBATCH line itself: the output went to the run's own folder, %j made the job id
    assert sorted(p.name for p in (run_dir / "slurm").iterdir()) == [f"job-{job}.out", "job.sh"]
