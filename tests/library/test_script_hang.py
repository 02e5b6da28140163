"""A user's script that hangs is ended `--hang-timeout` seconds after the verdict: the run fails with
the verdict as its reason and no process of it is left (real `mt launch train.py`, 2 gloo ranks)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import PidTracker, end_run, events, mt, status, wait_for
from tui.diagnose.hang import HANG_ENDED

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "scripts"


def test_a_hung_script_is_ended_after_hang_timeout_as_failed_with_the_verdict(tmp_path: Path) -> None:
    # the script's own gloo timeout is 60 s: the end must come from mt, long before it
    res = mt("launch", SCRIPTS / "faulty.py", "--nproc", "2", "--runs-dir", tmp_path / "runs", "--name", "hung",
             "--hang-timeout", "2", "--detach", "--", "--fault", "hang", "--at", "20", "--steps", "400", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = Path(res.stdout.strip().splitlines()[-1])
    tracker = PidTracker(run_dir)
    try:
        wait_for(lambda: tracker.collect() and status(run_dir).get("state") in ("failed", "completed", "stopped"),
                 120, "the run's end")
        st = status(run_dir)
        last = max(e["t"] for e in events(run_dir, "step"))
        assert st["state"] == "failed" and st["reason"].startswith(f"{HANG_ENDED} 2 s after the verdict"), st
        recs = [json.loads(line) for line in (run_dir / "incidents.jsonl").read_text().splitlines()]
        hang = next(r for r in recs if r["code"] == "hang" and r["status"] == "open")
        assert hang["evidence"]["suspect_ranks"] == [1] and hang["title"] in st["reason"], (hang, st)
        assert "--hang-timeout" in hang["advice"] and "pg_timeout_s" not in hang["advice"], hang["advice"]
        assert not [r for r in recs if r["code"] in ("crash", "nccl_timeout")], "the ended attempt was read as a crash"
        print(f"\nlast step -> verdict {hang['t'] - last:.1f} s -> run ended {st['ended'] - last:.1f} s: {st['reason']}")
        assert st["ended"] - last < 60, "ended by the script's own gloo timeout, not by mt"
        wait_for(lambda: tracker.alive() == [], 30, f"the run's processes to end (left: {tracker.alive()})")
    finally:
        end_run(run_dir)
