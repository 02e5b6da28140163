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

    def nonfinite(self, grad_norm: float) -> bool:
        """Whether this gradient norm means the step must be skipped; fp16's scaler judges its own overflows."""
        return not self.fp16 and not math.isfinite(grad_norm)

    def step(self, optimizer: torch.optim.Optimizer, nonfinite: bool) -> tuple[bool, float | None]:
        """The optimizer step unless it must be skipped; returns (skipped, fp16's loss scale after it)."""
        if not self.fp16:
            if not nonfinite:
                optimizer.step()
            return nonfinite, None
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)  # skips the update itself if gradients overflowed
        self.scaler.update()
        scale = self.scaler.get_scale()
        return nonfinite or scale < before, scale
