"""Exact resume after SIGKILL, resume on another world size, accumulation equivalence."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys

import pytest
import torch

from .runner import (
    SMALL,
    events,
    final_weights,
    finish,
    index_problem,
    kill_tree,
    logs,
    make_run,
    merge,
    run_engine,
    start,
    steps_by_attempt,
    wait_for,
)
from .usercode import GPT2, hf_base, user_base

HARD = {  # dropout, loader workers and accumulation all on: every source of state must be restored
    "model": {"dropout": 0.1},
    "data": {"num_workers": 1},
    "train": {"max_steps": 16, "grad_accum_steps": 2},
    "checkpoint": {"every_steps": 4, "keep_last": 2},
}


FSDP = {"train": {"strategy": "fsdp", "activation_checkpointing": True}}


def base_for(model: str, tmp_path) -> dict:
    """mt's GPT on synthetic tokens (also sharded by FSDP2, recomputing its blocks), a user's own
    model and dataset, or a tiny Hugging Face GPT-2."""
    return {"gpt": SMALL, "gpt-fsdp": merge(SMALL, FSDP), "python": user_base(tmp_path),
            "hf": hf_base(GPT2)}[model]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt-fsdp", "python", "hf"])  # mt's GPT under DDP: tests/engine/test_train.py and below
def test_sigkill_then_resume_reproduces_the_uninterrupted_run_bitwise(tmp_path, model):
    base = base_for(model, tmp_path)
    # ranks' states restored on two ranks under FSDP and under DDP (a user's model and data);
    # what is Hugging Face's own (its model's state and dropout) shows on one rank, without
    # three torchrun start-ups
    nproc = 1 if model == "hf" else 2
    reference = make_run(tmp_path, "reference", base, **HARD)
    uninterrupted = start(reference, nproc=nproc)  # at once: its start-up overlaps the killed run's
    if model == "gpt-fsdp":  # ... and the same run under DDP: sharding must not change what is learned
        ddp = make_run(tmp_path, "ddp", SMALL, **HARD)
        ddp_proc = start(ddp, nproc=2)

    run = make_run(tmp_path, "killed", base, **HARD)
    kill_after = random.Random().randint(6, 11)  # every phase of the 4-step interval, 5 steps before the end
    proc = start(run, nproc=nproc)
    wait_for(lambda: any(s["step"] >= kill_after for s in events(run, "step")), what=f"step {kill_after}")
    killed = kill_tree(proc.pid, signal.SIGKILL)
    assert len(killed) >= nproc + 1  # torchrun and both workers, or the one worker and its loader worker
    ckpts = events(run, "checkpoint")
    assert ckpts, "a checkpoint must exist before the kill"
    assert run_engine(run, nproc=nproc, attempt=2) == 0, logs(run)
    assert finish(uninterrupted, reference, 240) == 0, logs(reference)

    start2 = [e for e in events(run, "run_start") if e["attempt"] == 2][0]
    resumed_at = start2["start_step"]
    assert start2["resumed_from"]["exact"] is True and resumed_at % 4 == 0 and resumed_at >= ckpts[0]["step"]
    ref = {s["step"]: s for s in events(reference, "step")}
    after = steps_by_attempt(run)[2]
    assert [s["step"] for s in after] == list(range(resumed_at + 1, 17))
    for s in after:
        assert (s["loss"], s["grad_norm"], s["samples_seen"]) == (ref[s["step"]]["loss"], ref[s["step"]]["grad_norm"], ref[s["step"]]["samples_seen"]), s["step"]
    a, b = final_weights(reference), final_weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert index_problem(run / "events.jsonl") is None   # the binary index survived the kill too
    if model == "gpt-fsdp":
        assert finish(ddp_proc, ddp, 240) == 0, logs(ddp)
        first = events(reference, "run_start")[0]
        assert first["strategy"] == "fsdp" and first["activation_checkpointing"] is True
        once = subprocess.run([sys.executable, "-m", "tui.cli", "watch", str(reference), "--once"], capture_output=True, text=True)
        assert "world 2 x cpu  fsdp + act. ckpt" in once.stdout, once.stdout
        # the same weights in the same checkpoint format (a whole state dict), the same losses
        # up to the order of float sums in a reduce-scatter against an all-reduce
        d = final_weights(ddp)
        assert d.keys() == a.keys() and all(torch.allclose(d[k], a[k], rtol=1e-4, atol=1e-4) for k in a)
        for s in events(ddp, "step"):
            assert s["loss"] == pytest.approx(ref[s["step"]]["loss"], rel=1e-5), s["step"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt", "python"])
def test_resume_from_two_ranks_onto_one_keeps_the_sample_stream(tmp_path, model):
    # 256 samples, 16 per step: steps 1-16 are exactly one epoch
    base = base_for(model, tmp_path)
    data = {"synthetic_samples": 256} if model == "gpt" else {"args": {**base["data"]["args"], "n": 256}}
    over = {"data": data, "train": {"max_steps": 16, "grad_accum_steps": 2},
            "debug": {"trace_samples": True}, "checkpoint": {"every_steps": 0}}
    # the first attempt paced at 0.5 s a step (faults apply to it alone; losses do not depend on it):
    # the stop written after step 5 lands before step 16 on a loaded machine too (CI: it reached 16)
    run = make_run(tmp_path, "run", base, **over, faults={"step_sleep_s": 0.5})
    proc = start(run, nproc=2)
    wait_for(lambda: any(s["step"] >= 5 for s in events(run, "step")), what="step 5")
    (run / "control").mkdir(exist_ok=True)
    (run / "control/stop-1.json").write_text(json.dumps({"id": "stop-1", "action": "stop", "t": 0}))
    assert finish(proc, run, 120) == 0, logs(run)
    stopped_at = events(run, "run_end")[-1]["step"]
    assert events(run, "run_end")[-1]["status"] == "stopped" and 5 <= stopped_at < 16

    assert run_engine(run, nproc=1, attempt=2) == 0, logs(run)
    start2 = [e for e in events(run, "run_start") if e["attempt"] == 2][0]
    assert start2["world_size"] == 1 and start2["resumed_from"]["world_size_before"] == 2
    assert start2["resumed_from"]["grad_accum_now"] == 4 and start2["effective_batch"] == 16
    seen = [s["samples_seen"] for s in events(run, "step")]
    assert seen == [16 * k for k in range(1, 17)]

    used = []
    for rank in (0, 1):
        for line in (run / f"trace/rank{rank}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            used += [i for mb in rec["micro_batches"] for i in mb]
    assert sorted(used) == list(range(256))  # every sample of the epoch exactly once


def test_accumulation_gives_the_same_first_step_gradients(tmp_path):
    moments = []
    for micro, accum in [(8, 1), (2, 4)]:
        run = make_run(tmp_path, f"m{micro}", train={"micro_batch_size": micro, "grad_accum_steps": accum, "max_steps": 1, "warmup_steps": 0, "grad_clip": 0.0})
        assert run_engine(run) == 0, logs(run)
        path = events(run, "checkpoint")[-1]["path"]
        state = torch.load(f"{path}/optim.pt", weights_only=True)["optimizer"]["state"]
        # after one AdamW step exp_avg = (1 - beta1) * gradient: the gradients themselves, scaled
        moments.append([state[k]["exp_avg"] for k in sorted(state)])
        moments[-1].append(torch.tensor(events(run, "step")[0]["grad_norm"]))
    for a, b in zip(*moments):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
