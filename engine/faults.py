"""Injected faults ([faults]) for demos and tests. Only the first attempt is faulty, so a resume recovers."""
from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Callable

from engine.dist import log
from mt.contract.config import FaultsConfig

if TYPE_CHECKING:
    import torch


class Faults:
    def __init__(self, cfg: FaultsConfig, rank: int, attempt: int) -> None:
        self.cfg, self.rank = cfg, rank
        self.armed = attempt == 1
        self.step = 0  # the step in progress, for a planted module fault

    def before_step(self, step: int) -> None:
        """Crash or hang this rank at the configured step; pace every step for demos."""
        c = self.cfg
        self.step = step
        if c.step_sleep_s:
            time.sleep(c.step_sleep_s)
        if not self.armed:
            return
        if c.crash_at_step == step and c.crash_rank == self.rank:
            raise RuntimeError(f"injected crash at step {step} on rank {self.rank} ([faults] crash_at_step)")
        if c.hang_at_step == step and c.hang_rank == self.rank:
            log(f"injected hang at step {step} on rank {self.rank} ([faults] hang_at_step): this rank stops stepping")
            while True:  # the other ranks now wait in the next collective
                time.sleep(1.0)

    def at_exit(self) -> None:
        """hang_at_exit: hang_rank never returns from its shutdown, as a hung destroy_process_group would."""
        if self.armed and self.cfg.hang_at_exit and self.cfg.hang_rank == self.rank:
            log(f"injected hang at exit on rank {self.rank} ([faults] hang_at_exit): this rank's shutdown never returns")
            while True:
                time.sleep(1.0)

    def in_forward(self, micro: int) -> None:
        """step_work_s, and slow_rank's slow_step_s more (a slower device), in a step's first forward: its compute."""
        c = self.cfg
        extra = c.slow_step_s if c.slow_rank == self.rank else 0.0
        if micro == 0 and c.step_work_s + extra:
            time.sleep(c.step_work_s + extra)

    def maybe_poison(self, loss: torch.Tensor, step: int, micro: int) -> torch.Tensor:
        """NaN for the loss of rank 0's first micro-batch at nan_at_step, as a bad sample would give."""
        if self.armed and self.cfg.nan_at_step == step and self.rank == 0 and micro == 0:
            return loss * float("nan")
        return loss

    def plant(self, model: torch.nn.Module) -> None:
        """module_fault: a forward hook on the module named `module` that breaks its output (or the
        gradient at it) at module_at_step on module_rank, as a bad layer would: the cause `mt replay` must name."""
        c = self.cfg
        if not (c.module and c.module_at_step and c.module_fault):
            return
        found = dict(model.named_modules()).get(c.module)
        if found is None:
            raise ValueError(f"[faults] module = {c.module!r}: the model has no module of that name")
        found.register_forward_hook(self._hit)

    def _hit(self, module: torch.nn.Module, args: object, output: object) -> object:
        import torch

        c = self.cfg
        if not (self.armed and self.step == c.module_at_step and self.rank == c.module_rank and module.training
                and isinstance(output, torch.Tensor)):
            return None
        if c.module_fault == "grad_nan":
            if output.requires_grad:
                output.register_hook(lambda grad: grad * float("nan"))
            return None
        return {"nan": output * float("nan"), "inf": output + float("inf"), "spike": output * 100.0}[c.module_fault]

    def maybe_overflow(self, scaled: torch.Tensor, step: int) -> torch.Tensor:
        """At overflow_at_step the gradients overflow; the reported loss stays finite."""
        return scaled * 1e30 if self.armed and self.cfg.overflow_at_step == step else scaled

    def stall_at(self, step: int, samples: int, global_batch: int) -> dict[int, float]:
        """The sampler's stall, {sample index: seconds}: this rank's first sample of stall_at_step, when
        that step is still ahead of `step` (`samples` seen so far, `global_batch` per step)."""
        at, seconds = self.cfg.stall_at_step, self.cfg.stall_seconds
        if not (self.armed and at and seconds) or at <= step:
            return {}
        return {samples + (at - step - 1) * global_batch + self.rank: seconds}

    def in_checkpoint(self, step: int) -> Callable[[str], None] | None:
        """A hook for checkpoint.save that kills this process (or fails the write, or sleeps
        slow_checkpoint_s) after the first file of that step (sharded: train.pt, once every rank's shards are written)."""
        if self.armed and self.cfg.fail_checkpoint_at_step == step:
            def fail(name: str) -> None:
                raise OSError(f"injected write failure in checkpoint step {step} after {name} ([faults] fail_checkpoint_at_step)")

            return fail
        if self.cfg.slow_checkpoint_s and not (self.armed and self.cfg.crash_in_checkpoint_at_step == step):
            seconds, slept = self.cfg.slow_checkpoint_s, []

            def slow(name: str) -> None:
                if not slept:  # once a checkpoint, after its first file (sharded: train.pt, its only one here)
                    slept.append(name)
                    time.sleep(seconds)

            return slow
        if not (self.armed and self.cfg.crash_in_checkpoint_at_step == step):
            return None

        def die(name: str) -> None:
            log(f"injected crash while writing checkpoint step {step} (after {name})")
            os.kill(os.getpid(), signal.SIGKILL)

        return die
