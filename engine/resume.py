"""Deciding how a new attempt continues from a checkpoint, possibly on another world size."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ResumeRefused(ValueError):
    """The checkpoint cannot be continued with this configuration; the message says why and how."""


@dataclass
class ResumePlan:
    grad_accum_steps: int
    exact: bool
    """Same world size and batch: the run continues bit for bit."""
    note: str


def plan(train_state: dict[str, Any], world: int, micro: int, accum: int, allow_batch_change: bool) -> ResumePlan:
    """Keep the global batch across a world-size change by rescaling accumulation, or refuse."""
    old_world = int(train_state["world_size"])
    old_batch = int(train_state["global_batch"])
    if world == old_world and world * micro * int(train_state["grad_accum_steps"]) == old_batch:
        return ResumePlan(int(train_state["grad_accum_steps"]), True, "same world size: exact continuation")
    if old_batch % (world * micro) == 0:
        new_accum = old_batch // (world * micro)
        return ResumePlan(
            new_accum, False,
            f"world size {old_world} -> {world}: grad_accum_steps {train_state['grad_accum_steps']} -> {new_accum} "
            f"keeps the global batch at {old_batch} sequences; sample position kept exactly",
        )
    if allow_batch_change:
        return ResumePlan(
            accum, False,
            f"world size {old_world} -> {world}: global batch {old_batch} -> {world * micro * accum} "
            "(train.allow_batch_change = true); sample position kept exactly",
        )
    raise ResumeRefused(
        f"checkpoint was trained with a global batch of {old_batch} sequences on {old_world} ranks; "
        f"{world} ranks x micro_batch_size {micro} cannot reach it with whole accumulation steps. "
        "Resume on a world size that divides it, or set train.allow_batch_change = true"
    )
