"""`mt launch --slurm`: the run directory as `mt launch` makes it, then the batch script to sbatch."""
from __future__ import annotations

import shutil
from pathlib import Path

from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json
from mt.contract.status import read_status
from tui.cluster.slurm import Submitted, batch_script, cancel_quietly, dry_run_dir, require_sbatch, submit
from tui.supervise.launch import Overrides, create_run, resolve_config


def launch_slurm(preset: Path, over: Overrides) -> Submitted:
    """`mt launch PRESET --slurm`: the run directory as mt launch makes it, then submit; a failed
    submission leaves nothing behind (nothing ran)."""
    require_sbatch()
    run_dir = create_run(Path(preset), over, slurm=True)
    try:
        return submit(load_config_json(RunPaths(run_dir).config), run_dir)   # as the supervisor will read it
    except BaseException:
        status = read_status(run_dir)
        if status.slurm_job_id:
            cancel_quietly(status.slurm_job_id)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


def dry_run(preset: Path, over: Overrides) -> str:
    """`mt launch PRESET --slurm --dry-run`: the batch script, for a run directory not made."""
    cfg, _ = resolve_config(Path(preset), over, slurm=True)
    return batch_script(cfg, dry_run_dir(cfg))
