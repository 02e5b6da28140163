"""What every rank learns at the end of a step, in the step's one small collective: the step's only
read from the device (one host-device sync per optimizer step)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.dist import DistEnv
from engine.metrics import StepMemory, memory

# the columns of the row each rank contributes: device values first, then the host's
_LOSS, _NORM, _FOUND_INF, _SCALE, _GROWTH, _STOP, _CKPT, _MEM, _PEAK, _KNOB = range(10)
_ON_DEVICE = 5  # loss, grad norm and fp16's scaler state (found inf, scale, growth tracker) stay on the device


@dataclass(frozen=True)
class Agreed:
    """The same answers on every rank."""
    loss: float  # the mean over ranks; NaN when any rank's is not finite
    nonfinite: bool  # some rank's loss is not finite (a NaN in any micro-batch poisons its rank's mean)
    stop: bool  # some rank was asked to stop (a signal, or a stop request on rank 0)
    checkpoint: bool  # a checkpoint was requested
    mem: int  # allocated bytes, the most of any rank
    peak: int  # peak allocated bytes this step, the most of any rank
    own: StepMemory | None = None  # this rank's own reading (its heartbeat reports it)
    grad_norm: float = math.nan  # this rank's gradient norm (the same on every rank: gradients are synced)
    found_inf: bool = False  # fp16: some rank's unscaled gradients overflowed (the scaler skips the step)
    scale: float | None = None  # fp16: the loss scale this step used
    growth: int = 0  # fp16: the scaler's growth tracker before this step
    knob: bool = False  # rank 0 took a `set` request: its settings are broadcast after this step (engine/knobs.py)


def agree(env: DistEnv, loss_local: torch.Tensor, stop: bool, checkpoint: bool,
          grad_norm: torch.Tensor | None = None, scaler_state: torch.Tensor | None = None, knob: bool = False) -> Agreed:
    """Collective: this rank's mean loss, gradient norm, fp16 scaler state (found inf, scale, growth
    tracker) and wishes in, the agreed answers out; one read from the device."""
    own = memory(env.device)
    mem, peak = own.allocated, own.peak
    if hasattr(grad_norm, "full_tensor"):  # fsdp's norm is a replicated DTensor: its local value is the whole
        grad_norm = grad_norm.full_tensor()
    device_part = torch.stack([loss_local.detach().to(torch.float64),
                               (grad_norm if grad_norm is not None else torch.full((), math.nan, device=env.device))
                               .detach().to(torch.float64)])
    state = scaler_state if scaler_state is not None else torch.zeros(3, device=env.device)
    host = torch.tensor([float(stop), float(checkpoint), mem, peak, float(knob)], dtype=torch.float64)
    if env.device.type == "cuda":  # pinned, so the copy up is queued on the stream instead of blocking the host
        host = host.pin_memory()
    row = torch.cat([device_part, state.to(torch.float64), host.to(env.device, non_blocking=True)])
    if env.world_size == 1:  # no one to agree with: no collective
        return dataclasses.replace(_answers([row.tolist()], 0), own=own)
    return dataclasses.replace(_gathered(env, row), own=own)


def _gathered(env: DistEnv, row: torch.Tensor) -> Agreed:
    """The answers from one all_gather of every rank's row (tests call it on a group of one)."""
    rows = [torch.empty_like(row) for _ in range(env.world_size)]
    dist.all_gather(rows, row)
    return _answers(torch.stack(rows).tolist(), env.rank)  # the one read from the device


def _answers(table: list[list[float]], rank: int) -> Agreed:
    """The agreed answers from every rank's row, in plain floats (no tensor read back again)."""
    losses = [r[_LOSS] for r in table]
    finite = all(math.isfinite(x) for x in losses)
    mine = table[rank]
    fp16 = mine[_SCALE] > 0
    return Agreed(
        loss=sum(losses) / len(losses) if finite else float("nan"),
        nonfinite=not finite,
        stop=any(r[_STOP] for r in table),
        checkpoint=any(r[_CKPT] for r in table),
        mem=int(max(r[_MEM] for r in table)),
        peak=int(max(r[_PEAK] for r in table)),
        grad_norm=mine[_NORM],
        found_inf=any(r[_FOUND_INF] for r in table),
        scale=mine[_SCALE] if fp16 else None,
        growth=int(mine[_GROWTH]),
        knob=any(r[_KNOB] for r in table),
    )
