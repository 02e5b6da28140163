"""The components the loop asks (engine/train.py): each decides on its own when it acts, and how."""
from __future__ import annotations

import math
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from engine.checkpoint.saver import Checkpointer
from engine.consensus import Agreed, _gathered, agree
from engine.dist import DistEnv
from engine.evaluate import Evaluator
from engine.faults import Faults
from engine.parallel import Parallel
from engine.precision import Precision
from mt.contract.config import FaultsConfig
from mt.contract.eventlog import NullEventWriter
from mt.contract.preset import config_from_dict

from .runner import SMALL, merge

CPU = DistEnv(0, 0, 1, torch.device("cpu"), "gloo")


def _cfg(**sections: dict):
    return config_from_dict(merge(SMALL, sections), "test")


def test_checkpoint_reason_first_match_wins():
    # stop, then the last step, then a request, then the interval (docs/checkpoints.md)
    due = Checkpointer(_cfg(train={"max_steps": 12}, checkpoint={"every_steps": 4}), *[None] * 9).due
    assert due(12, stop=True, requested=True) == "stop"
    assert due(12, stop=False, requested=True) == "final"
    assert due(8, stop=False, requested=True) == "request"
    assert due(8, stop=False, requested=False) == "interval"
    assert [s for s in range(1, 13) if due(s, False, False)] == [4, 8, 12]
    never = Checkpointer(_cfg(train={"max_steps": 12}, checkpoint={"every_steps": 0}), *[None] * 9).due
    assert [s for s in range(1, 13) if never(s, False, False)] == [12] and never(3, False, True) == "request"


def test_eval_runs_every_eval_every_steps_and_at_the_last_and_never_without_a_val_split():
    def steps(val: object, every: int) -> list[int]:
        ev = Evaluator(_cfg(train={"max_steps": 12, "eval_every": every}), CPU, SimpleNamespace(val=val), None, None,
                       None, "the GPT", NullEventWriter())
        return [s for s in range(1, 13) if ev.due(s)]

    assert steps([1], 5) == [5, 10, 12]
    assert steps([1], 4) == [4, 8, 12]
    assert steps([1], 0) == [] and steps(None, 5) == []


def test_faults_compute_their_own_triggers_and_only_on_the_first_attempt():
    cfg = FaultsConfig(stall_at_step=6, stall_seconds=0.5, nan_at_step=3, overflow_at_step=4)
    f = Faults(cfg, rank=1, attempt=1)
    # rank 1's first sample of step 6 in the global order: 5 whole steps of 8 samples, then its slot
    assert f.stall_at(0, 0, 8) == {5 * 8 + 1: 0.5}
    assert f.stall_at(3, 24, 8) == {24 + 2 * 8 + 1: 0.5}  # resumed at step 3
    assert f.stall_at(6, 48, 8) == {}  # that step is behind us
    assert Faults(cfg, rank=1, attempt=2).stall_at(0, 0, 8) == {}
    one = torch.ones(())
    assert math.isnan(Faults(cfg, 0, 1).maybe_poison(one, 3, 0)) and f.maybe_poison(one, 3, 0) is one  # rank 0 only
    assert Faults(cfg, 0, 1).maybe_poison(one, 3, 1) is one  # its first micro-batch only
    assert float(f.maybe_overflow(one, 4)) > 1e29 and f.maybe_overflow(one, 5) is one
    assert Faults(cfg, 0, 2).maybe_poison(one, 3, 0) is one and Faults(cfg, 0, 2).maybe_overflow(one, 4) is one


def _one_step(precision: str, loss_factor: float) -> tuple[bool, float | None, bool, bool]:
    """(skipped, scale, whether the non-finite check fired, whether the weight changed) of one step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prec = Precision(_cfg(train={"precision": precision, "grad_clip": 1.0}), CPU, Parallel(model, nullcontext, "ddp"))
    before = model.weight.detach().clone()
    with prec.autocast():
        loss = model(torch.ones(2, 4)).float().pow(2).mean()
    prec.backward(loss * loss_factor)
    norm = prec.unscale_and_clip(opt, model.parameters())
    agreed = agree(CPU, loss.detach(), False, False, norm, prec.scaler_state(opt))  # as the loop reads them
    nonfinite = prec.nonfinite(agreed.grad_norm)
    skipped, scale = prec.step(opt, nonfinite, agreed.found_inf, agreed.scale, agreed.growth)
    if precision == "fp16":  # the scale derived on the host is the scaler's own after its update
        assert scale == prec.scaler.get_scale()
    return skipped, scale, nonfinite, not torch.equal(before, model.weight)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_precision_steps_finite_gradients_and_skips_overflowed_ones(precision):
    fp16 = precision == "fp16"
    skipped, scale, nonfinite, moved = _one_step(precision, 1e-3)  # small enough for fp16 at a scale of 2**16
    assert (skipped, nonfinite, moved) == (False, False, True) and (scale is not None) == fp16
    skipped, scale, nonfinite, moved = _one_step(precision, math.inf)
    assert skipped and not moved
    assert nonfinite != fp16  # fp16's scaler judges its own overflow: the step is skipped, not non-finite
    if fp16:
        assert scale == 65536.0 / 2  # the scaler backed off


@pytest.fixture
def group_of_one(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("loss", [2.5, math.nan, math.inf, -math.inf])
def test_one_rank_agrees_as_the_gathered_row_would(group_of_one, loss):
    # one rank skips the collective: its answers must be the all_gather path's on the same input
    local = torch.tensor(loss, dtype=torch.float64)
    norm = torch.tensor(1.5)
    alone = agree(CPU, local, stop=True, checkpoint=False, grad_norm=norm, knob=True)
    row = torch.tensor([loss, 1.5, 0, 0, 0, 1.0, 0.0, alone.mem, alone.peak, 1.0], dtype=torch.float64)
    gathered = _gathered(CPU, row)
    assert alone.grad_norm == gathered.grad_norm == 1.5
    assert isinstance(alone, Agreed) and alone.nonfinite == gathered.nonfinite == (not math.isfinite(loss))
    assert (alone.stop, alone.checkpoint, alone.knob) == (gathered.stop, gathered.checkpoint, gathered.knob) == (True, False, True)
    assert alone.loss == gathered.loss or (math.isnan(alone.loss) and math.isnan(gathered.loss))
    assert (alone.mem, alone.peak) == (gathered.mem, gathered.peak)


def test_the_loop_starts_where_one_call_says_a_two_rank_checkpoint_resumed_on_one_rank():
    # engine/checkpoint/resume.py start_position: the full format's weights, optimizer, this rank's
    # RNG and the data position, with accumulation doubled to keep the global batch of two ranks
    from engine.checkpoint import full
    from engine.checkpoint.resume import start_position
    from mt.contract.attempt import ResumeRefused
    cfg = _cfg(train={"micro_batch_size": 2, "grad_accum_steps": 1})
    written = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(written.parameters())
    written(torch.ones(1, 3)).sum().backward()
    opt.step()
    torch.manual_seed(1234)
    rng = full.capture_rng(CPU.device)
    expected = torch.rand(4)             # what rank 0's stream gives next after the checkpoint
    state = {"step": 7, "samples_seen": 28, "world_size": 2, "grad_accum_steps": 1, "global_batch": 4,
             "rng": [rng, rng], "scaler": {}}
    parts = {"train.pt": state, "model.pt": written.state_dict(),
             "optim.pt": {"optimizer": opt.state_dict(), "scaler": {}}}

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    fresh = start_position(None, cfg, CPU, model, Parallel(model, nullcontext, "none"), optimizer, scaler)
    assert (fresh.step, fresh.samples, fresh.accum, fresh.resumed_from) == (0, 0, 1, None)

    torch.manual_seed(0)
    at = start_position(("ckpt/step-7", parts, []), cfg, CPU, model, Parallel(model, nullcontext, "none"),
                        optimizer, scaler)
    assert (at.step, at.samples, at.accum) == (7, 28, 2)
    assert at.resumed_from["world_size_before"] == 2 and at.resumed_from["exact"] is False
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), written.state_dict().values()))
    assert optimizer.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert torch.equal(torch.rand(4), expected)

    wider = {"train.pt": state, "model.pt": torch.nn.Linear(4, 2).state_dict(), "optim.pt": parts["optim.pt"]}
    with pytest.raises(ResumeRefused, match="does not fit the model"):
        start_position(("ckpt/step-7", wider, []), cfg, CPU, model, Parallel(model, nullcontext, "none"),
                       optimizer, scaler)
