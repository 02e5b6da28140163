"""Rollbacks made by the engine (mt/contract/rollback.py, engine/checkpoint/rollback.py): on_nan =
"rollback" ends the attempt, the next continues from the checkpoint before the bad step with the
batches skipped, and a rolled-back run killed and resumed equals an uninterrupted one bit for bit."""
from __future__ import annotations

import math

import pytest
import torch

from mt.contract import rollback
from mt.contract.paths import RunPaths

from .runner import REPO, events, final_weights, finish, kill_tree, logs, make_run, run_engine, start, steps_by_attempt, wait_for

# global batch 8 (1 rank x 4 x 2): checkpoints every 2 steps, a NaN injected at step 5 of attempt 1
NAN = {"train": {"max_steps": 12, "on_nan": "rollback"}, "checkpoint": {"every_steps": 2}, "faults": {"nan_at_step": 5}}


def _rolled_back_once(run, nproc: int = 1) -> None:
    """Attempt 1 meets the NaN at step 5 and ends asking for a rollback to step 4."""
    assert run_engine(run, nproc) == 0, logs(run)
    assert events(run, "run_end")[-1]["status"] == rollback.RUN_END
    req = rollback.read_request(RunPaths(run))
    assert req is not None and (req.step, req.to_step, req.skip_batches, req.by, req.count) == (5, 4, 1, "on_nan", 1)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])  # 2: rank 0 decides and every rank learns it (broadcasts at the NaN and at the start)
def test_on_nan_rollback_continues_from_the_checkpoint_before_with_the_batches_skipped(tmp_path, nproc):
    run = make_run(tmp_path, **NAN)
    _rolled_back_once(run, nproc)
    assert run_engine(run, nproc, attempt=2) == 0, logs(run)
    [rb] = events(run, "rollback")
    assert (rb["step"], rb["to_step"], rb["skip_batches"], rb["lr_scale"], rb["by"], rb["count"]) == (5, 4, 1, 1.0, "on_nan", 1)
    assert any(e["code"] == "rolled_back" for e in events(run, "incident"))
    steps = steps_by_attempt(run)[2]
    assert [s["step"] for s in steps] == list(range(5, 13))
    # the position moved past the skipped batch: step 5 ends at (4 + 1 skipped + 1) global batches (8 a rank)
    assert steps[0]["samples_seen"] == 6 * 8 * nproc and all(math.isfinite(s["loss"]) for s in steps)
    assert events(run, "run_end")[-1]["status"] == "completed"
    # the request is spent once a checkpoint holds it; the next start removes it
    assert rollback.held(RunPaths(run).checkpoints, 1)


@pytest.mark.slow
def test_a_rolled_back_run_killed_and_resumed_equals_an_uninterrupted_one_bitwise(tmp_path):
    pace = {"faults": {**NAN["faults"], "step_sleep_s": 0.2}}
    whole = make_run(tmp_path, "whole", **{**NAN, **pace})
    _rolled_back_once(whole)
    assert run_engine(whole, attempt=2) == 0, logs(whole)

    cut = make_run(tmp_path, "cut", **{**NAN, **pace})
    _rolled_back_once(cut)
    # killed twice: once around the rollback's first steps (maybe before a checkpoint holds it), once later
    for attempt, at in ((2, 5), (3, 8)):
        proc = start(cut, attempt=attempt)
        wait_for(lambda a=attempt, s=at: any(e["step"] >= s for e in steps_by_attempt(cut).get(a, [])), 180,
                 f"attempt {attempt} at step {at}")
        kill_tree(proc.pid)
        proc.wait()
    assert finish(start(cut, attempt=4), cut) == 0, logs(cut)
    assert len(events(cut, "rollback")) >= 1  # attempt 2 made it; attempt 3 again only if 2 died before a checkpoint held it
    assert {e["count"] for e in events(cut, "rollback")} == {1}
    a, b = final_weights(whole), final_weights(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    last = {s["step"]: s["loss"] for s in steps_by_attempt(whole)[2]}
    assert all(s["loss"] == last[s["step"]] for s in steps_by_attempt(cut)[4])


@pytest.mark.parametrize(("over", "says"), [
    ({"train": {"rollback_budget": 0}}, "the rollback budget is spent (train.rollback_budget = 0)"),
    ({"checkpoint": {"every_steps": 0}}, "no checkpoint before step 5 to roll back to"),
])
def test_a_nan_that_cannot_roll_back_stops_the_run_saying_why(tmp_path, over, says):
    run = make_run(tmp_path, **{**NAN, "train": {**NAN["train"], **over.get("train", {})},
                                "checkpoint": {**NAN["checkpoint"], **over.get("checkpoint", {})}})
    assert run_engine(run) == 0, logs(run)
    end = events(run, "run_end")[-1]
    assert end["status"] == "stopped" and end["step"] == 4 and says in end["reason"], end
    assert "train.on_nan = \"rollback\"" in end["reason"] and not (run / "rollback.json").exists()
    assert events(run, "checkpoint")[-1]["reason"] == "stop"  # the last good state, as on_nan = "stop" keeps it


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])  # 2: the mislabelled sample is rank 1's; rank 0's rules see the agreed loss
def test_on_spike_rollback_goes_back_before_a_mislabelled_sample_and_skips_it(tmp_path, nproc):
    from bench.poisoned import order

    # order position 195: step 25 at a global batch of 8 (one rank), 13 at 16; checkpoints every 5 steps
    poison = order(4096, 7, [195])
    bad = 195 // (8 * nproc) + 1
    back = (bad - 1) // 5 * 5
    run = make_run(tmp_path, run={"workdir": str(REPO / "bench")},
                   model={"kind": "python", "factory": "poisoned:model", "args": {"hidden": 32}},
                   data={"source": "python", "factory": "poisoned:build",
                         "args": {"n": 4096, "poison": poison, "kind": "spike", "val_n": 0}},
                   train={"max_steps": 40, "micro_batch_size": 8, "grad_accum_steps": 1, "lr": 1e-2, "on_spike": "rollback"},
                   checkpoint={"every_steps": 5, "keep_last": 10}, monitor={"spike_min_history": 10})
    assert run_engine(run, nproc) == 0, logs(run)
    assert events(run, "run_end")[-1]["status"] == rollback.RUN_END, logs(run)
    assert [e["step"] for e in events(run, "incident") if e["code"] == "loss_spike"] == [bad]
    assert run_engine(run, nproc, attempt=2) == 0, logs(run)
    [rb] = events(run, "rollback")
    assert (rb["step"], rb["to_step"], rb["skip_batches"], rb["by"]) == (bad, back, bad - back, "on_spike")
    again = steps_by_attempt(run)[2]
    assert again[0]["step"] == back + 1 and again[0]["samples_seen"] == (bad + 1) * 8 * nproc and again[-1]["step"] == 40
    assert [e["step"] for e in events(run, "incident") if e["code"] == "loss_spike"] == [bad]  # not met again
    # set aside: the stop checkpoint of the step after the spike, and the spike step's own interval one
    assert {p.name for p in (run / "checkpoints" / "abandoned").iterdir()} == \
        {f"1-step-{bad + 1}"} | ({f"1-step-{bad}"} if bad % 5 == 0 else set())


POISONED = {"run": {"workdir": str(REPO / "bench")},
            "model": {"kind": "python", "factory": "poisoned:model", "args": {"hidden": 32}},
            "train": {"max_steps": 40, "micro_batch_size": 8, "grad_accum_steps": 1, "lr": 1e-2, "on_nan": "rollback"},
            "checkpoint": {"every_steps": 5, "keep_last": 10}}


@pytest.mark.slow
def test_each_nan_of_a_poisoned_dataset_is_rolled_back_once_and_never_met_again(tmp_path):
    from bench.poisoned import order

    # global batch 8: two inf samples at order positions 90 and 178 (steps 12 and 23; after the
    # first rollback skipped 2 batches, step 21)
    run = make_run(tmp_path, **POISONED, data={"source": "python", "factory": "poisoned:build",
                                              "args": {"n": 4096, "poison": order(4096, 7, [90, 178]), "val_n": 0}})
    for attempt in (1, 2, 3):
        assert run_engine(run, attempt=attempt) == 0, logs(run)
    assert [e["step"] for e in events(run, "incident") if e["code"] == "nan_loss"] == [12, 21]
    assert [(e["step"], e["to_step"], e["skip_batches"], e["count"]) for e in events(run, "rollback")] == [(12, 10, 2, 1), (21, 20, 1, 2)]
    assert [e["status"] for e in events(run, "run_end")] == [rollback.RUN_END, rollback.RUN_END, "completed"]
    assert not (run / "rollback.json").exists()
