"""Real training runs: precisions work, fp16 overflows and NaNs are reported and handled.

(The shipped tiny preset's run, every event checked against the schema, is in
tests/cli/test_doctor_and_preset.py: one run under mt launch proves both.)
"""
from __future__ import annotations

import math

import pytest

from mt.contract.events import as_float

from .runner import events, logs, make_run, run_engine


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, precision):
    # fp16's run also overflows once at step 4 (one run for both tests; with accumulation, as the
    # overflow test had it): it must still train
    fp16 = precision == "fp16"
    run = make_run(tmp_path, train={"precision": precision, "max_steps": 16, "grad_accum_steps": 2 if fp16 else 1},
                   faults={"overflow_at_step": 4} if fp16 else {})
    assert run_engine(run) == 0, logs(run)
    steps = events(run, "step")
    assert len(steps) == 16
    assert all(math.isfinite(s["loss"]) for s in steps)
    assert sum(s["loss"] for s in steps[-3:]) / 3 < steps[0]["loss"] - 0.3
    assert ("loss_scale" in steps[0]) == (precision == "fp16")
    start = events(run, "run_start")[0]
    assert start["precision"] == precision and start["model"] == "the GPT"
    # the GPT's kind counts exactly: 6N without the position table, plus attention's 12 * layers * d_model * seq_len
    assert start["flops_per_token"] == 6.0 * (start["params_total"] - 32 * 32) + 12.0 * 2 * 32 * 32
    if fp16:  # the forced overflow is reported as a skipped step
        _overflow_is_a_skipped_step({s["step"]: s for s in steps})


def _overflow_is_a_skipped_step(steps: dict) -> None:
    assert steps[4]["skipped"] is True
    assert steps[4]["loss_scale"] == steps[3]["loss_scale"] / 2
    assert math.isfinite(steps[4]["loss"])
    assert not any(steps[s]["skipped"] for s in steps if s != 4)


def test_nan_injection_reports_samples_and_skip_keeps_training_finite(tmp_path):
    # under fsdp (the stop test below is ddp's): the same incident, skip and samples through DTensor gradients
    run = make_run(tmp_path, train={"max_steps": 10, "on_nan": "skip", "strategy": "fsdp"}, faults={"nan_at_step": 5},
                   checkpoint={"every_steps": 0})
    assert run_engine(run) == 0, logs(run)
    steps = {s["step"]: s for s in events(run, "step")}
    assert math.isnan(as_float(steps[5]["loss"])) and steps[5]["skipped"] is True
    assert all(math.isfinite(steps[s]["loss"]) for s in steps if s != 5)
    nan = [e for e in events(run, "incident") if e["code"] == "nan_loss"]
    assert len(nan) == 1 and nan[0]["step"] == 5
    # rank 0's first micro-batch of step 5: micro_batch_size samples, dataset indices
    assert len(nan[0]["evidence"]["sample_indices"]) == 4
    assert all(0 <= i < 512 for i in nan[0]["evidence"]["sample_indices"])
    assert events(run, "run_end")[-1]["status"] == "completed" and events(run, "run_start")[0]["strategy"] == "fsdp"


def test_nan_with_on_nan_stop_checkpoints_the_last_good_state(tmp_path):
    import torch
    run = make_run(tmp_path, train={"max_steps": 10, "on_nan": "stop"}, faults={"nan_at_step": 5})
    assert run_engine(run) == 0, logs(run)
    end = events(run, "run_end")[-1]
    assert end["status"] == "stopped" and end["step"] == 4
    ckpt = events(run, "checkpoint")[-1]
    assert ckpt["step"] == 4 and ckpt["reason"] == "stop"
    weights = torch.load(f"{ckpt['path']}/model.pt", weights_only=True)
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_a_tmpdir_too_long_for_a_socket_path_does_not_hang_the_loader(tmp_path):
    # DataLoader workers pass each batch through an AF_UNIX socket under TMPDIR (at most 107
    # bytes); past it the worker loses the batch and the loader used to wait forever
    long_tmp = tmp_path / ("t" * 60) / ("m" * 40)
    long_tmp.mkdir(parents=True)
    run = make_run(tmp_path, data={"num_workers": 1}, train={"max_steps": 3})
    assert run_engine(run, env={"TMPDIR": str(long_tmp)}, timeout=120) == 0, logs(run)
    assert [s["step"] for s in events(run, "step")] == [1, 2, 3]
    assert f"TMPDIR {long_tmp} is too long for the sockets" in (run / "logs/rank0.log").read_text()
    assert not list(long_tmp.glob("pymp-*"))  # multiprocessing made nothing there
