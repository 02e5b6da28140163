"""One type for the engine's answer to a control request: `mt ckpt` / `mt stop` (wait_answer) and
the viewer's state (RunState.controls) fold the same events into the same answer."""
from __future__ import annotations

from pathlib import Path

from tests.tui.synth import SynthRun
from tui.read.follower import load_run_state
from tui.state.answers import ControlAnswer
from tui.supervise.control import wait_answer


def test_wait_answer_and_the_viewer_give_the_same_answer(tmp_path: Path) -> None:
    r = SynthRun(tmp_path, max_steps=10)
    r.run_start()
    r.step(1)
    # the checkpoint event names both requests it answers; the second's done came before it
    r.event("control", request_id="ck-2", action="checkpoint", status="accepted", detail="queued")
    r.event("control", request_id="ck-2", action="checkpoint", status="done", detail="")
    r.event("control", request_id="ck-1", action="checkpoint", status="accepted", detail="")
    r.event("checkpoint", step=1, path="checkpoints/step-1", bytes=10, seconds=0.1, reason="request",
            request_id="ck-1", request_ids=["ck-1", "ck-2"])
    r.event("control", request_id="ck-1", action="checkpoint", status="done", detail="")
    r.event("control", request_id="st-1", action="stop", status="rejected", detail="already stopping")
    r.step(2)
    r.event("run_end", step=2, status="stopped", reason="stop requested")
    r.flush()
    r.status("stopped", exit_code=0, ended=r.t)
    viewer = load_run_state(tmp_path).controls
    for rid in ("ck-1", "ck-2", "st-1"):
        answer = wait_answer(tmp_path, rid, timeout=5)
        assert isinstance(answer, ControlAnswer) and answer == viewer[rid], rid
    assert viewer["ck-2"].checkpoint is not None and viewer["ck-2"].checkpoint.step == 1
    assert (viewer["st-1"].status, viewer["st-1"].detail) == ("rejected", "already stopping")
    assert viewer["ck-1"].complete and viewer["ck-2"].complete


def test_an_unanswered_request_is_ended_or_timed_out_for_mt_ckpt(tmp_path: Path) -> None:
    r = SynthRun(tmp_path, max_steps=10)
    r.run_start()
    r.event("control", request_id="ck-1", action="checkpoint", status="accepted", detail="queued")
    r.flush()
    r.status("completed", exit_code=0, ended=r.t)
    answer = wait_answer(tmp_path, "ck-1", timeout=5)
    assert (answer.action, answer.status) == ("checkpoint", "ended") and "before answering" in answer.detail
    assert load_run_state(tmp_path).controls["ck-1"].status == "accepted"   # the viewer shows what the engine said
