"""A run whose disk fills up: the failure is recorded and explained, and the run resumes once there is room."""
from __future__ import annotations

import json
import time

import pytest

from mt.contract import checkpoints, space
from mt.contract.paths import RunPaths
from mt.contract.status import FINAL_STATES
from tests.tmpfs import fill, resize, tmpfs

from .conftest import events, mt, run_dir_from, status, wait_for, write_preset

# ~409k parameters: each checkpoint is about 4.8 MiB (weights + two AdamW moments), so a 7 MiB
# filesystem holds the run's small files and one checkpoint, never two.
BIG_MODEL = {"n_layer": 2, "d_model": 128}


@pytest.mark.slow
def test_full_disk_fails_clearly_and_resumes_once_there_is_room(tmp_path):
    with tmpfs("7m") as mnt:
        preset = write_preset(tmp_path / "p.toml", mnt / "runs", launch={"nproc_per_node": 1}, model=BIG_MODEL)
        launched = mt("launch", preset, "--detach")
        assert launched.returncode == 0, launched.stderr
        run = run_dir_from(launched.stdout)
        st = wait_for(lambda: status(run) if status(run).get("state") in FINAL_STATES else None, 120, "a final state")

        # step 8 fits; step 16 (interval) is skipped; step 24 (final) cannot be, so the run fails
        assert st["state"] == "failed", st
        assert st["reason"].startswith("rank 0: disk full: no room for checkpoint step-24"), st["reason"]
        assert f"filesystem {mnt}" in st["reason"] and "free" in st["reason"] and "needs about" in st["reason"]
        assert events(run, "run_end")[-1]["reason"] == st["reason"]
        full = [(e["step"], e["title"]) for e in events(run, "incident") if e["code"] == "disk_full"]
        assert full == [(16, "Checkpoint at step 16 skipped: disk full"), (24, "Checkpoint at step 24 failed: disk full")]
        assert [c["step"] for c in events(run, "checkpoint")] == [8]
        assert not list((run / "checkpoints").glob(".tmp-*"))
        from engine.checkpoint import pick  # torch: only this test process pays for it
        checkpoints.verify(run / "checkpoints/step-8")
        assert pick.load(run / "checkpoints/step-8")["train.pt"]["step"] == 8

        refused = mt("resume", run, "--detach")
        assert refused.returncode == 2 and refused.stdout == ""
        line = refused.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, refused.stderr
        assert line.startswith(f"mt: {run}: disk full, the next checkpoint would not fit") and f"on {mnt}" in line
        assert status(run)["state"] == "failed"  # the refusal changed nothing

        resize(mnt, "32m")
        resumed = mt("resume", run, "--detach")
        assert resumed.returncode == 0, resumed.stderr
        wait_for(lambda: status(run).get("state") in FINAL_STATES and status(run).get("attempt") == 2, 120, "attempt 2 to end")
        assert status(run)["state"] == "completed", (status(run).get("reason"), (run / "logs/rank0.log").read_text()[-3000:])
        start = [e for e in events(run, "run_start") if e["attempt"] == 2][0]
        assert start["resumed_from"]["step"] == 8
        assert [c["step"] for c in events(run, "checkpoint")] == [8, 16, 24]


def test_supervisor_records_the_final_state_on_a_full_disk(tmp_path):
    from tui.supervise.failure import attempt_failure
    from tui.supervise.launch import Overrides, create_run
    from tui.supervise.supervisor import Supervisor

    with tmpfs("1m") as mnt:
        preset = write_preset(tmp_path / "p.toml", mnt / "runs")
        run = create_run(preset, Overrides())
        sup = Supervisor(run)
        paths = RunPaths(run)
        assert space.ensure_reserve(paths.reserve)
        sup.status.attempt = 1
        sup.write_status("running")
        fill(mnt)
        sup.status.ended, sup.status.reason = time.time(), "rank 0: disk full"
        sup.write_status("failed")
        assert json.loads(paths.status.read_text())["state"] == "failed"
        assert not paths.reserve.exists()  # spent to make that room

        sup.status.attempts = [{"attempt": n, "note": "x" * 4096} for n in range(64)]  # no room now
        sup.write_status("killed")  # does not raise, and leaves the previous file whole
        assert json.loads(paths.status.read_text())["state"] == "failed"
        assert not [p for p in run.iterdir() if p.name.startswith(".status.json.")]
        fill(mnt, "more")  # what the released reserve gave back
        assert "disk full: filesystem" in attempt_failure(sup.cfg, paths, 1, 1, None)  # when the engine could not say so
