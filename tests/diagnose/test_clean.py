"""Clean runs must stay silent: noise, evaluation and checkpoint pauses, start-up, a resume."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from mt.contract.config import MonitorConfig

from .fakerun import FakeRun
from .streams import loss_curve


def clean_attempt(run: FakeRun, rng: random.Random, steps: int, eval_every: int, ckpt_every: int,
                  gpu: bool, losses: list[float]) -> None:
    """Steps with jittery timing, worker start-up on the first ones, eval/ckpt pauses."""
    base = rng.uniform(0.15, 0.4)
    for k in range(steps):
        first = k < 2  # DataLoader workers start: the first batches wait
        st = base * rng.uniform(0.8, 1.3) + (1.5 if first else 0.0)
        wait = (1.4 if first else base * rng.uniform(0.0, 0.15))
        run.do_step(step_time=st, data_wait=wait, loss=losses[run.step % len(losses)],
                    tokens=4096 * rng.uniform(0.95, 1.05))
        if gpu:
            run.sample(gpu_util=rng.uniform(85, 99), mem_share=rng.uniform(0.6, 0.8))
        if eval_every and run.step % eval_every == 0:
            run.idle(rng.uniform(2, 12), gpu_util=None if not gpu else 40.0)
            run.event("eval", step=run.step, val_loss=2.5)
        if ckpt_every and run.step % ckpt_every == 0:
            run.idle(rng.uniform(3, 25))
            run.event("checkpoint", step=run.step, path="x", bytes=1, seconds=1.0, reason="interval", request_id=None)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gpu", [False, True])
def test_clean_run_with_pauses_and_resume_is_silent(tmp_path: Path, seed: int, gpu: bool) -> None:
    rng = random.Random(seed)
    run = FakeRun(tmp_path / "run", eval_every=25, checkpoint_every=40)
    losses = loss_curve(400, seed)
    run.start()
    clean_attempt(run, rng, 120, 25, 40, gpu, losses)
    # the run stops; a resume from step 80 starts after a gap, with a fresh warm-up
    run.status({"state": "stopped", "attempt": 1, "exit_code": 0})
    run.event("run_end", step=run.step, status="stopped", reason="stop requested")
    run.poll()
    run.idle(40)
    run.status({"state": "running", "attempt": 2, "exit_code": None})
    run.idle(15)  # torch import, model build: no events, heartbeats from attempt 1
    run.start(start_step=80)
    clean_attempt(run, rng, 100, 25, 40, gpu, losses)
    run.status({"state": "completed", "attempt": 2, "exit_code": 0})
    run.poll()
    assert run.records == []
    assert run.file() == []


def test_slow_steady_steps_are_not_a_hang(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "run", monitor=m)
    run.start()
    for _ in range(12):  # each step takes a bit longer than the hang floor's share of a step
        run.do_step(step_time=m.hang_floor_s * 0.9, data_wait=0.05)
    assert run.records == []
