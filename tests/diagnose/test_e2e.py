"""End to end: real runs of the tiny CPU model with injected [faults], under `mt launch`.

The supervisor runs the IncidentMonitor; each fault must put its code into incidents.jsonl
within 10 s (or 3 logged steps) of the fault, at the fault's step; a clean run of the same
preset, judged with the same thresholds, must raise no warn/error incident.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from .scenarios import CLEAN, FAULTS, NAN_STALL_CRASH, Outcome, launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

LATENCY_S = 10.0
LATE_STEPS = 3


def on_time(o: Outcome, code: str) -> None:
    """Within 10 s of the fault; a step-driven (engine-side) code may instead be within 3 steps.
    A crash, hang or stall stops the steps, so for them only the clock counts."""
    lat, late = o.latency_s(code), o.steps_late(code)
    assert lat is not None, (code, o.codes, o.run_dir)
    by_steps = code in ("nan_loss", "loss_spike", "grad_explosion", "fp16_overflow") and late is not None
    assert lat <= LATENCY_S or (by_steps and late <= LATE_STEPS), (code, lat, late, o.run_dir)


def test_nan_stall_and_crash(tmp_path: Path) -> None:
    scn = NAN_STALL_CRASH
    o = launch(scn, tmp_path)
    assert o.state == "failed"
    nan, stall, crash = o.first("nan_loss"), o.first("dataloader_stall"), o.first("crash")
    assert nan and stall and crash, (o.codes, o.run_dir)
    assert nan["step"] == scn.faults["nan_at_step"] and nan["source"] == "engine"
    assert nan["evidence"]["sample_indices"] and nan["evidence"]["action"] == "skip"
    assert stall["step"] == scn.faults["stall_at_step"] and stall["source"] == "supervisor"
    # an 8 s stall is seen while it lasts: every rank waits on its queue, its worker is busy
    ev = stall["evidence"]
    assert ev["in_progress"] and ev["idle_s"] < scn.faults["stall_seconds"]
    assert all(any(w["syscall"] not in ("poll", "futex") for w in r["workers"]) for r in ev["ranks"].values())
    assert crash["step"] == scn.faults["crash_at_step"]
    assert crash["evidence"]["rank"] == scn.faults["crash_rank"]  # the first to die, not its peer
    assert "injected crash" in crash["evidence"]["line"]
    for code in ("nan_loss", "dataloader_stall", "crash"):
        on_time(o, code)
    assert sorted(o.codes) == ["crash", "dataloader_stall", "nan_loss"]  # nothing else on the way


def test_hang_then_collective_timeout(tmp_path: Path) -> None:
    scn = next(s for s in FAULTS if s.name == "hang_timeout")
    o = launch(scn, tmp_path)
    assert o.state == "failed"
    hang, timeout = o.first("hang"), o.first("nccl_timeout")
    assert hang and timeout, (o.codes, o.run_dir)
    assert hang["step"] == scn.faults["hang_at_step"]
    assert hang["evidence"]["suspect_ranks"] == [scn.faults["hang_rank"]]
    on_time(o, "hang")
    # the rank that timed out is not the culprit; the timeout says which one the hang named
    assert timeout["t"] > hang["t"] and f"rank {scn.faults['hang_rank']} had stopped" in timeout["title"]
    assert sorted(o.codes) == ["hang", "nccl_timeout"]


def test_clean_run_raises_nothing(tmp_path: Path) -> None:
    o = launch(CLEAN, tmp_path)
    assert o.state == "completed"
    assert o.alarms() == [], o.alarms()
