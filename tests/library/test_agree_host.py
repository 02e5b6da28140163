"""The library's step agreement is host-only (issue 31 item 2): a gloo group of the script's ranks,
never a tensor on `torch.cuda.current_device()` (every rank's on GPU 0 when a script skips set_device)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_ranks_agree_through_a_host_group_of_their_own(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(REPO / "tests" / "library" / "scripts" / "agree_ranks.py")],
                          capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for rank in (0, 1) for x in (tmp_path / f"ranks_{rank}.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "step" in x]
    assert len(steps) == 8
    for x in steps:  # the same answers on both ranks: rank 1's checkpoint at 2, rank 0's stop at 4, tokens summed
        assert (x["checkpoint"], x["stop"], x["tokens"]) == (x["step"] == 2, x["step"] == 4, 30.0), x
    assert [x["own_group"] for x in lines if "own_group" in x] == [True, True]
