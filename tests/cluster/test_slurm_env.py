"""`scripts/slurm.sh env DIR`: lines a shell can eval (no cluster needed)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cluster.conftest import SCRIPT


def test_slurm_sh_env_prints_an_export_a_shell_can_eval(tmp_path: Path) -> None:
    cluster = tmp_path / "a cluster's dir"   # a space and a quote: the path is quoted for the shell
    out = subprocess.run(["bash", str(SCRIPT), "env", str(cluster)], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.startswith("export SLURM_CONF="), out.stdout
    got = subprocess.run(["bash", "-c", 'eval "$(bash "$0" env "$1")" && bash -c \'echo "$SLURM_CONF"\'', str(SCRIPT), str(cluster)],
                         capture_output=True, text=True, timeout=30, check=True)
    assert got.stdout == f"{cluster.resolve()}/slurm.conf\n", got.stdout + got.stderr
