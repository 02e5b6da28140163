"""Synthetic step streams shaped like real training: an early fall, noise, warmup, plateaus."""
from __future__ import annotations

import math
import random
from typing import Any


def loss_curve(n: int, seed: int, start: float = 5.5, floor: float = 2.0, tau: float = 40.0,
               noise: float = 0.04) -> list[float]:
    """Exponential fall from `start` to `floor` with multiplicative noise (as minibatch loss has)."""
    rng = random.Random(seed)
    return [(floor + (start - floor) * math.exp(-i / tau)) * (1 + rng.gauss(0, noise)) for i in range(n)]


def grad_curve(n: int, seed: int, start: float = 4.0, floor: float = 0.4, tau: float = 30.0) -> list[float]:
    """Grad norm: large at init, settling, log-normal noise with occasional 2-3x bumps."""
    rng = random.Random(seed + 1000)
    out = []
    for i in range(n):
        g = (floor + (start - floor) * math.exp(-i / tau)) * math.exp(rng.gauss(0, 0.25))
        if rng.random() < 0.02:
            g *= rng.uniform(2.0, 3.0)
        out.append(g)
    return out


def lr_at(i: int, n: int, peak: float = 3e-3, warmup: int = 15) -> float:
    if i < warmup:
        return peak * (i + 1) / warmup
    return 3e-4 + 0.5 * (peak - 3e-4) * (1 + math.cos(math.pi * (i - warmup) / max(1, n - warmup)))


def steps(n: int, seed: int, grad_clip: float = 1.0, first_step: int = 1, **curve: Any) -> list[dict[str, Any]]:
    """Step-event fields for a clean fp32 run."""
    losses = loss_curve(n + first_step - 1, seed, **curve)[first_step - 1:]
    grads = grad_curve(n + first_step - 1, seed)[first_step - 1:]
    out = []
    for k in range(n):
        i = k + first_step - 1
        out.append({
            "step": i + 1, "loss": losses[k], "lr": lr_at(i, n + first_step), "grad_norm": grads[k],
            "clipped": grads[k] > grad_clip > 0, "skipped": False, "loss_scale": None,
            "step_time_s": 0.2, "data_wait_s": 0.002, "tokens_per_s": 10000.0,
        })
    return out
