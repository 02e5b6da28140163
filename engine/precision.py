"""The run's numeric precision ([train] precision): autocast, and fp16's loss scaler behind plain calls.

The loop calls `backward`, `unscale_and_clip` and `step` the same way under bf16, fp16 and fp32;
only fp16 scales the loss, unscales before clipping, and lets the scaler skip an overflowed step.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from engine.dist import DistEnv
from engine.parallel import Parallel
from mt.contract.config import Config

_AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}


def grad_scaler(par: Parallel, cfg: Config, env: DistEnv) -> torch.amp.GradScaler:
    """fp16's loss scaler (disabled otherwise). Under fsdp each rank sees only its shards' gradients:
    ShardedGradScaler all-reduces "found inf" so every rank skips the same step (FSDP2's DTensor
    gradients included). Both keep the same state dict, so a checkpoint resumes under either."""
    on = cfg.train.precision == "fp16"
    if par.strategy == "fsdp":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        return ShardedGradScaler(env.device.type, enabled=on)
    return torch.amp.GradScaler(env.device.type, enabled=on)


class Precision:
    """bf16 / fp16 / fp32 for one run; `scaler` is what a checkpoint saves and restores."""

    def __init__(self, cfg: Config, env: DistEnv, par: Parallel) -> None:
        self.fp16 = cfg.train.precision == "fp16"
        self.device_type = env.device.type
        self.amp_dtype = _AMP.get(cfg.train.precision)
        self.grad_clip = cfg.train.grad_clip
        self.scaler = grad_scaler(par, cfg, env)  # disabled (a pass-through) unless fp16; sharded under fsdp
        if env.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls on tensor cores
            torch.backends.cudnn.allow_tf32 = True

    def autocast(self) -> AbstractContextManager[Any]:
        return torch.autocast(self.device_type, dtype=self.amp_dtype) if self.amp_dtype else nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale_and_clip(self, optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> torch.Tensor:
        """The gradients' total norm (a tensor: reading it is a sync), clipped to grad_clip if set."""
        if self.fp16:
            self.scaler.unscale_(optimizer)  # clip and measure true (unscaled) gradients
        return torch.nn.utils.clip_grad_norm_(params, self.grad_clip or math.inf)

    def scaler_state(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """fp16, after unscale_: (found inf, scale, growth tracker) as a device tensor, so the step's one
        read (engine/consensus.py) brings them up and `step` needs no get_scale() (a sync each). None otherwise."""
        if not self.fp16:
            return None
        s = self.scaler
        found = s._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values()  # what unscale_ found
        scale = s._scale.reshape(())
        return torch.stack([sum(f.to(scale.device).reshape(()) for f in found).float(), scale.float(),
                            s._growth_tracker.reshape(()).float()])

    def nonfinite(self, grad_norm: float) -> bool:
        """Whether this gradient norm means the step must be skipped; fp16's scaler judges its own overflows."""
        return not self.fp16 and not math.isfinite(grad_norm)

    def step(self, optimizer: torch.optim.Optimizer, nonfinite: bool, found_inf: bool = False, scale: float | None = None,
             growth: int = 0) -> tuple[bool, float | None]:
        """The optimizer step unless it must be skipped; returns (skipped, fp16's loss scale after it).

        fp16: `found_inf`, `scale` and `growth` are scaler_state() as read by the step's agreement; the scale
        after the update follows GradScaler.update's rule from them, so nothing is read from the device here."""
        if not self.fp16:
            if not nonfinite:
                optimizer.step()
            return nonfinite, None
        self.scaler.step(optimizer)  # skips the update itself if gradients overflowed
        self.scaler.update()
        s = self.scaler
        if scale is None:
            return nonfinite or found_inf, None
        if found_inf:
            after = scale * s.get_backoff_factor()
        elif growth + 1 >= s.get_growth_interval():
            after = scale * s.get_growth_factor()
        else:
            after = scale
        return nonfinite or found_inf, after
