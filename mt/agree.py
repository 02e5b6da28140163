"""The one tiny collective of a script's step: every rank learns whether to checkpoint or stop.

torch is taken from `sys.modules`, never imported: a script that has not imported it has no
process group, and one rank needs no agreement.
"""
from __future__ import annotations

import sys
from typing import Any


def process_group() -> Any:
    """torch.distributed once the script has initialised a process group, else None."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


class Agreement:
    """Folds each rank's wishes (checkpoint, stop) and token count into one all_reduce per step.

    The flags are host values, reduced on the host over a gloo group of the same ranks, whatever the
    script's backend: never on a GPU (NCCL's), so no device is chosen for them and no device sync is paid."""

    def __init__(self, world_size: int) -> None:
        self._host_group: Any = None  # made by every rank together at their first decide()
        self.alone = world_size < 2  # WORLD_SIZE says so: no group to ask, every step

    @staticmethod
    def _group() -> Any:
        """torch.distributed with a process group of more than one rank, or None."""
        dist = process_group()
        return dist if dist is not None and dist.get_world_size() > 1 else None

    def decide(self, checkpoint: bool, stop: bool, tokens: float | None) -> tuple[bool, bool, float | None]:
        """(checkpoint, stop, tokens summed over ranks): True on every rank if any rank asked."""
        if self.alone:
            return checkpoint, stop, tokens
        dist = self._group()
        if dist is None:
            return checkpoint, stop, tokens
        torch = sys.modules["torch"]
        if self._host_group is None:  # a collective: every rank reaches its first decide() at the same step
            self._host_group = dist.new_group(backend="gloo")
        flags = torch.tensor([float(checkpoint), float(stop), float(tokens or 0.0), float(tokens is not None)],
                             dtype=torch.float64)
        dist.all_reduce(flags, group=self._host_group)
        ckpt, stp, total, known = flags.tolist()
        return ckpt > 0, stp > 0, total if known > 0 else None

    def backend(self) -> str | None:
        dist = self._group()
        return str(dist.get_backend()) if dist is not None else None

    @staticmethod
    def device_name() -> str | None:
        """The GPU this process uses if the script has touched CUDA, else None (unknown)."""
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return None
        return str(cuda.get_device_name(cuda.current_device()))
