"""A script's rank slow on its input is named from the data time it reports (`run.step(data_s=...)`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import end_run, mt, run_dir_from, wait_for

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parent / "scripts" / "slow_rank.py"


def test_a_script_rank_slow_on_its_data_is_named_input_bound(tmp_path: Path) -> None:
    launch = mt("launch", SCRIPT, "--nproc", "2", "--runs-dir", tmp_path / "runs", "--detach", "--", "--delay", "0.05",
                cwd=tmp_path)
    assert launch.returncode == 0, launch.stdout + launch.stderr
    run_dir = run_dir_from(launch.stdout)
    try:
        def opened() -> dict | None:
            try:
                lines = (run_dir / "incidents.jsonl").read_text().splitlines()
            except OSError:
                return None
            return next((r for r in map(json.loads, lines) if r["code"] == "straggler" and r["status"] == "open"), None)
        inc = wait_for(opened, 90, "a straggler incident")
        ev = inc["evidence"]
        assert ev["rank"] == 1 and ev["bound"] == "input", inc
        assert inc["detail"].startswith("rank 1 is input-bound: it waits ") and "rank 0 waits ~" in inc["detail"], inc
        assert ev["anatomy"]["1"]["data_s"] > 0.04 > ev["anatomy"]["0"]["data_s"], ev
        hb = json.loads((run_dir / "heartbeat" / "rank0").read_text())
        assert set(hb["anatomy"]) == {"n", "step_s", "data_s", "mt_s"}, hb  # a script's step, its data, mt's part
    finally:
        end_run(run_dir)
