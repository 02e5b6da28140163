"""Requests from outside: checkpoint now, graceful stop, SIGTERM, and malformed request files."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch

from .runner import events, finish, kill_tree, logs, make_run, run_engine, start, wait_for

SLOW_STEPS = {"train": {"max_steps": 400}, "faults": {"step_sleep_s": 0.02}}


def drop(run, rid: str, action: str) -> None:
    (run / "control").mkdir(exist_ok=True)
    tmp = run / "control" / f".{rid}.tmp"
    tmp.write_text(json.dumps({"id": rid, "action": action, "t": time.time()}))
    tmp.rename(run / "control" / f"{rid}.json")


def answer(run, rid: str, status: str = "done") -> dict:
    return wait_for(lambda: next((e for e in events(run, "control") if e["request_id"] == rid and e["status"] == status), None), timeout=60, what=f"{status} for {rid}")


@pytest.fixture(scope="module")
def sigterm_run(tmp_path_factory):
    """The SIGTERM test's run, started with the checkpoint test's so their start-ups overlap
    (long enough to be still training when its turn comes)."""
    run = make_run(tmp_path_factory.mktemp("sigterm"), **{**SLOW_STEPS, "train": {"max_steps": 4000}})
    proc = start(run, nproc=2)
    yield run, proc
    kill_tree(proc.pid)


@pytest.mark.slow
def test_checkpoint_request_then_stop_on_two_ranks(tmp_path, sigterm_run):
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
    assert finish(proc, run, 120) == 0, logs(run)
    end = events(run, "run_end")[-1]
    last = events(run, "checkpoint")[-1]
    assert end["status"] == "stopped" and last["reason"] == "stop" and last["request_id"] == "st-1"
    assert last["step"] == end["step"] < 400


@pytest.mark.slow
def test_sigterm_to_torchrun_is_a_graceful_stop(sigterm_run):
    run, proc = sigterm_run
    wait_for(lambda: len(events(run, "step")) >= 3, what="3 steps")
    # SIGUSR2 to a rank writes its stack to its log (what a hung rank is doing) and changes nothing else
    pid = json.loads((run / "heartbeat/rank1").read_text())["pid"]
    os.kill(pid, signal.SIGUSR2)
    stack = wait_for(lambda: "_run_module_as_main" in (text := (run / "logs/rank1.log").read_text()) and text, what="rank 1's stack")
    assert "(most recent call first)" in stack and 'engine/train.py", line' in stack
    steps = len(events(run, "step"))
    wait_for(lambda: len(events(run, "step")) > steps + 2, what="training to go on after SIGUSR2")
    proc.send_signal(signal.SIGTERM)
    finish(proc, run, 120)
    end = wait_for(lambda: events(run, "run_end"), what="run_end")[-1]
    assert end["status"] == "stopped" and "SIGTERM" in end["reason"], logs(run)
    last = events(run, "checkpoint")[-1]
    assert last["reason"] == "stop" and last["step"] == end["step"]
    assert (run / f"checkpoints/step-{end['step']}/manifest.json").exists()


HOSTILE = {
    "t-str.json": '{"id": "b", "action": "checkpoint", "t": "soon"}',
    "t-null.json": '{"id": "c", "action": "checkpoint", "t": null}',
    "t-nan.json": '{"id": "d", "action": "stop", "t": NaN}',
    "id-dict.json": '{"id": {"x": 1}, "action": "stop", "t": 1}',
    "list.json": "[1, 2]",
    "deep.json": "[" * 100000,
    "notes.txt": "hello",
}


def _plant_hostile(run, outside) -> None:
    control = run / "control"
    control.mkdir(exist_ok=True)
    for name, text in HOSTILE.items():
        (control / name).write_text(text)
    outside.write_text(json.dumps({"id": "outside", "action": "stop", "t": 1.0}))
    (control / "link.json").symlink_to(outside)
    (control / "folder.json").mkdir()
    os.mkfifo(control / "fifo.json")


def test_inbox_rejects_every_hostile_entry_and_empties_itself(tmp_path):
    from mt.contract.inbox import ControlInbox

    run = tmp_path / "run"
    run.mkdir()
    _plant_hostile(run, tmp_path / "outside.json")
    (run / "control" / "ok.json").write_text(json.dumps({"id": "ok", "action": "checkpoint", "t": 5}))
    inbox = ControlInbox(run / "control")
    polled = inbox.poll()
    assert [r.id for r in polled.requests] == ["ok"]
    why = {rid: detail for rid, _action, detail in polled.rejected}
    assert len(polled.rejected) == len(HOSTILE) + 3
    assert "t must be a number" in why["b"] and "t must be a number" in why["c"] and "t must be a number" in why["d"]
    assert "symbolic link" in why["link"] and "not a regular file" in why["folder"] and "not a regular file" in why["fifo"]
    left = sorted(p.name for p in (run / "control").iterdir())
    assert left == ["ok.json", "processed"]
    assert (tmp_path / "outside.json").exists()  # the link moved, its target untouched
    assert (run / "control/processed/link.json").is_symlink()
    assert inbox.poll().rejected == []


def test_processed_stays_bounded(tmp_path):
    from mt.contract.inbox import ControlInbox

    inbox = ControlInbox(tmp_path / "control")
    for i in range(ControlInbox.KEEP_PROCESSED + 20):
        p = tmp_path / "control" / f"r{i}.json"
        p.write_text("{}")
        inbox.done(p)
    assert len(list((tmp_path / "control/processed").iterdir())) == ControlInbox.KEEP_PROCESSED


def test_hostile_control_entries_never_end_a_run(tmp_path):
    """Found at start (as a resume or auto-restart finds them): each is rejected, the run completes."""
    run = make_run(tmp_path)
    _plant_hostile(run, tmp_path / "outside.json")
    assert run_engine(run) == 0, logs(run)
    rejected = [e for e in events(run, "control") if e["status"] == "rejected"]
    assert len(rejected) == len(HOSTILE) + 3
    assert events(run, "run_end")[-1]["status"] == "completed"  # the outside stop request was not obeyed
    assert sorted(p.name for p in (run / "control").iterdir()) == ["processed"]


def test_two_checkpoint_requests_in_one_step_are_both_answered(tmp_path):
    from tui.supervise.control import wait_answer

    run = make_run(tmp_path, train={"max_steps": 3})
    drop(run, "ckpt-a", "checkpoint")
    drop(run, "ckpt-b", "checkpoint")        # both are taken at the first step's poll
    assert run_engine(run) == 0, logs(run)
    step1 = [c for c in events(run, "checkpoint") if c["reason"] == "request"]
    assert len(step1) == 1 and step1[0]["request_ids"] == ["ckpt-a", "ckpt-b"]
    for rid in ("ckpt-a", "ckpt-b"):        # was: the second waited for a checkpoint naming it, and timed out
        got = wait_answer(run, rid, timeout=5)
        assert got.status == "done" and got.checkpoint is not None and got.checkpoint.step == 1, rid
