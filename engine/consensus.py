"""What every rank learns at the end of a step, in the step's one small collective (a sync point)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.dist import DistEnv
from engine.metrics import StepMemory, memory

# the columns of the row each rank contributes
_LOSS, _STOP, _CKPT, _MEM, _PEAK = range(5)


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


def agree(env: DistEnv, loss_local: torch.Tensor, stop: bool, checkpoint: bool) -> Agreed:
    """Collective: this rank's mean loss and wishes in, the agreed answers out."""
    own = memory(env.device)
    mem, peak = own.allocated, own.peak
    if env.world_size == 1:  # no one to agree with: the same answers without a dozen tiny tensor ops
        loss = float(loss_local)
        finite = math.isfinite(loss)
        return Agreed(loss if finite else float("nan"), not finite, stop, checkpoint, int(mem), int(peak), own)
    return dataclasses.replace(_gathered(env, loss_local, stop, checkpoint, mem, peak), own=own)


def _gathered(env: DistEnv, loss_local: torch.Tensor, stop: bool, checkpoint: bool, mem: int, peak: int) -> Agreed:
    """The answers from one all_gather of every rank's row (tests call it on a group of one)."""
    row = torch.tensor([0.0, float(stop), float(checkpoint), mem, peak], dtype=torch.float64, device=env.device)
    row[_LOSS] = loss_local
    rows = [torch.empty_like(row) for _ in range(env.world_size)]
    dist.all_gather(rows, row)
    table = torch.stack(rows).cpu()
    losses = table[:, _LOSS]
    finite = bool(torch.isfinite(losses).all())
    return Agreed(
        loss=float(losses.sum() / len(losses)) if finite else float("nan"),
        nonfinite=not finite,
        stop=bool(table[:, _STOP].any()),
        checkpoint=bool(table[:, _CKPT].any()),
        mem=int(table[:, _MEM].max()),
        peak=int(table[:, _PEAK].max()),
    )
