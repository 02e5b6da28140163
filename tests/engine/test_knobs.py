"""Knobs turned in a live engine run (engine/knobs.py): applied by every rank at one step, kept by the
checkpoints after it, and a resume reproduces the run that was never interrupted, bit for bit."""
from __future__ import annotations

import json
import random
import re
import signal
import time

import pytest

from engine.data import GlobalOrderSampler
from engine.optim import lr_at
from mt.contract.preset import config_from_dict

from .runner import SMALL, events, finish, kill_tree, logs, make_run, merge, run_engine, start, steps_by_attempt, wait_for

HARD = {  # dropout, loader workers and accumulation on: every source of state must come back on resume
    "model": {"dropout": 0.1},
    "data": {"num_workers": 1},
    "train": {"max_steps": 16, "grad_accum_steps": 2},
    "checkpoint": {"every_steps": 4, "keep_last": 2},
    "debug": {"trace_samples": True},
}
SETTINGS = {"lr_scale": 0.5, "skip_batches": 3}


def drop_set(run, rid: str, settings: dict) -> None:
    """A `set` request in control/, as `mt set` writes it (taken at the run's first step)."""
    (run / "control").mkdir(exist_ok=True)
    tmp = run / "control" / f".{rid}.tmp"
    tmp.write_text(json.dumps({"id": rid, "action": "set", "t": time.time(), "settings": settings}))
    tmp.rename(run / "control" / f"{rid}.json")


def traced(run, attempt: int) -> dict[int, list[list[int]]]:
    """Rank 0's sample indices per step of one attempt (debug.trace_samples)."""
    rows = [json.loads(line) for line in (run / "trace" / "rank0.jsonl").read_text().splitlines()]
    return {r["step"]: r["micro_batches"] for r in rows if r["attempt"] == attempt}


@pytest.mark.slow
def test_a_set_then_kill_and_resume_is_bitwise_the_uninterrupted_run_that_got_the_same_set(tmp_path):
    reference = make_run(tmp_path, "reference", SMALL, **HARD)
    drop_set(reference, "set-1", SETTINGS)
    uninterrupted = start(reference, nproc=2)
    run = make_run(tmp_path, "killed", SMALL, **HARD)
    drop_set(run, "set-1", SETTINGS)
    proc = start(run, nproc=2)
    kill_after = random.Random().randint(6, 11)  # past the checkpoint at 4 (or 8) that keeps the knobs
    wait_for(lambda: any(s["step"] >= kill_after for s in events(run, "step")), what=f"step {kill_after}")
    kill_tree(proc.pid, signal.SIGKILL)
    assert run_engine(run, nproc=2, attempt=2) == 0, logs(run)
    assert finish(uninterrupted, reference, 240) == 0, logs(reference)

    # taken at step 1, applied by both ranks from step 2: a knob event each, the request answered
    knobs = events(reference, "knob")
    assert [(k["step"], k["key"], k["value"], k["request"]) for k in knobs] == [
        (2, "lr_scale", 0.5, "set-1"), (2, "skip_batches", 3, "set-1")]
    done = [c for c in events(reference, "control") if c["request_id"] == "set-1" and c["status"] == "done"]
    assert len(done) == 1 and "applied from step 2" in done[0]["detail"]
    for rank in (0, 1):
        assert "knobs from step 2: lr_scale=0.5, skip_batches=3" in (reference / "logs" / f"rank{rank}.log").read_text()

    cfg = config_from_dict(merge(SMALL, HARD), "test")
    global_batch = 2 * 4 * 2  # ranks x micro batch x accumulation
    ref = {s["step"]: s for s in events(reference, "step")}
    assert ref[1]["lr"] == lr_at(1, cfg.train) and ref[1]["samples_seen"] == global_batch
    assert ref[2]["samples_seen"] == (2 + 3) * global_batch   # the three batches after step 1 skipped
    # the skip moves the position only: step 2 reads what step 5 would have read, the order kept
    sampler = GlobalOrderSampler(512, cfg.run.seed, 0, 2, 0)
    order = iter(sampler)
    plain = [[next(order) for _ in range(4)] for _ in range(2 * 16 + 6)]   # rank 0's micro-batches in the unskipped order
    trace = traced(reference, 1)
    assert trace[2] == plain[2 * 4:2 * 5] and trace[1] == plain[0:2]

    resumed = [e for e in events(run, "run_start") if e["attempt"] == 2][0]
    at = resumed["start_step"]
    assert resumed["resumed_from"]["exact"] is True and at % 4 == 0 and 4 <= at < 16 and resumed["knobs"]
    after = steps_by_attempt(run)[2]
    assert [s["step"] for s in after] == list(range(at + 1, 17))
    for s in after:   # the scheduler's lr, scaled: a resume never undoes the knob
        assert s["lr"] == lr_at(s["step"], cfg.train) * 0.5, s["step"]
        want = ref[s["step"]]
        assert (s["loss"], s["grad_norm"], s["samples_seen"], s["lr"]) == (
            want["loss"], want["grad_norm"], want["samples_seen"], want["lr"]), s["step"]
    assert traced(run, 2) == {k: v for k, v in trace.items() if k > at}
    assert not events(run, "knob")[len(events(reference, "knob")):]   # nothing applied twice


@pytest.mark.slow
def test_intervals_and_clip_turned_mid_run_hold_from_the_step_after_and_a_bad_set_is_rejected(tmp_path):
    run = make_run(tmp_path, "run", SMALL, train={"max_steps": 400, "grad_clip": 1.0, "log_every": 1},
                   faults={"step_sleep_s": 0.05})
    proc = start(run)
    try:
        wait_for(lambda: len(events(run, "step")) >= 3, what="3 steps")
        drop_set(run, "bad", {"lr_scale": -1})
        drop_set(run, "set-2", {"log_every": 5, "checkpoint_every": 7, "grad_clip": 1e-6})
        done = wait_for(lambda: [c for c in events(run, "control") if c["request_id"] == "set-2" and c["status"] == "done"],
                        what="set-2 applied")
        first = int(re.search(r"from step (\d+)", done[0]["detail"]).group(1))
        wait_for(lambda: any(c["step"] >= first + 14 for c in events(run, "checkpoint")), what="two checkpoints after")
    finally:
        kill_tree(proc.pid)
    bad = [c for c in events(run, "control") if c["request_id"] == "bad"]
    assert bad[-1]["status"] == "rejected" and "lr_scale: -1 must be > 0" in bad[-1]["detail"]
    steps = events(run, "step")
    before = [s for s in steps if s["step"] < first]
    after = [s for s in steps if s["step"] >= first]
    assert [s["step"] for s in before] == list(range(1, first))   # every step logged before
    assert all(s["step"] % 5 == 0 for s in after) and after   # every 5th after
    assert all(s["clipped"] for s in after)                   # the clip the step reports is the new one
    ckpt_steps = [c["step"] for c in events(run, "checkpoint")]
    assert ckpt_steps[:2] == [s for s in range(first, first + 15) if s % 7 == 0][:2]
    assert {k["key"]: k["previous"] for k in events(run, "knob")} == {"log_every": 1, "checkpoint_every": 0, "grad_clip": 1.0}
