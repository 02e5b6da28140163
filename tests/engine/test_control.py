"""Requests from outside: checkpoint now, graceful stop, SIGTERM, and malformed request files."""
from __future__ import annotations

import json
import signal
import time

import pytest
import torch

from .runner import events, logs, make_run, start, wait_for

SLOW_STEPS = {"train": {"max_steps": 400}, "faults": {"step_sleep_s": 0.02}}


def drop(run, rid: str, action: str) -> None:
    (run / "control").mkdir(exist_ok=True)
    tmp = run / "control" / f".{rid}.tmp"
    tmp.write_text(json.dumps({"id": rid, "action": action, "t": time.time()}))
    tmp.rename(run / "control" / f"{rid}.json")


def answer(run, rid: str, status: str = "done") -> dict:
    return wait_for(lambda: next((e for e in events(run, "control") if e["request_id"] == rid and e["status"] == status), None), timeout=60, what=f"{status} for {rid}")


@pytest.mark.slow
def test_checkpoint_request_then_stop_on_two_ranks(tmp_path):
    run = make_run(tmp_path, **SLOW_STEPS)
    proc = start(run, nproc=2)
    wait_for(lambda: len(events(run, "step")) >= 3, what="3 steps")
    drop(run, "ck-1", "checkpoint")
    done = answer(run, "ck-1")
    ckpt = next(c for c in events(run, "checkpoint") if c["request_id"] == "ck-1")
    assert ckpt["reason"] == "request" and f"step {ckpt['step']}" in done["detail"]
    state = torch.load(f"{ckpt['path']}/train.pt", weights_only=True)
    assert state["step"] == ckpt["step"] and len(state["rng"]) == 2  # both ranks took part at that step
    assert not (run / "control/ck-1.json").exists() and (run / "control/processed/ck-1.json").exists()
    wait_for(lambda: any(s["step"] > ckpt["step"] + 2 for s in events(run, "step")), what="training to go on")

    drop(run, "bad", "explode")
    assert "action must be one of" in answer(run, "bad", "rejected")["detail"]
    drop(run, "st-1", "stop")
    assert proc.wait(timeout=120) == 0, logs(run)
    end = events(run, "run_end")[-1]
    last = events(run, "checkpoint")[-1]
    assert end["status"] == "stopped" and last["reason"] == "stop" and last["request_id"] == "st-1"
    assert last["step"] == end["step"] < 400


@pytest.mark.slow
def test_sigterm_to_torchrun_is_a_graceful_stop(tmp_path):
    run = make_run(tmp_path, **SLOW_STEPS)
    proc = start(run, nproc=2)
    wait_for(lambda: len(events(run, "step")) >= 3, what="3 steps")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    end = wait_for(lambda: events(run, "run_end"), what="run_end")[-1]
    assert end["status"] == "stopped" and "SIGTERM" in end["reason"], logs(run)
    last = events(run, "checkpoint")[-1]
    assert last["reason"] == "stop" and last["step"] == end["step"]
    assert (run / f"checkpoints/step-{end['step']}/manifest.json").exists()
