"""The config a new attempt runs with: how it continues from a checkpoint on another world size.

Stdlib only: `mt resume` derives the attempt's config with the same `plan` the engine follows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mt.contract.config import Config
from mt.contract.preset import config_from_dict


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


def attempt_config(cfg: Config, manifest: dict[str, Any], nproc: int | None = None) -> Config:
    """The config of a new attempt from a checkpoint (its manifest.json), on `nproc` workers per node.

    Injected faults fire on attempt 1 only, so one aimed at a rank the new world lacks is
    disarmed; `grad_accum_steps` is what the engine's `plan` will run with. ResumeRefused or
    ConfigError (naming `--nproc`) when the checkpoint cannot continue on that world.
    """
    raw = cfg.to_dict()
    if nproc is not None:
        raw["launch"]["nproc_per_node"] = nproc
    world = raw["launch"]["nproc_per_node"] * raw["launch"]["nnodes"]
    for fault in ("crash", "hang"):
        if raw["faults"][f"{fault}_rank"] >= world:
            raw["faults"][f"{fault}_at_step"] = 0
    micro = cfg.train.micro_batch_size
    old_world, old_batch = manifest.get("world_size"), manifest.get("global_batch")
    if isinstance(old_world, int) and isinstance(old_batch, int) and old_world > 0 and old_batch > 0:
        before = {"world_size": old_world, "global_batch": old_batch, "grad_accum_steps": old_batch // (old_world * micro)}
        how = plan(before, world, micro, cfg.train.grad_accum_steps, cfg.train.allow_batch_change)
        raw["train"]["grad_accum_steps"] = how.grad_accum_steps
    return config_from_dict(raw, "--nproc" if nproc is not None else "config.json")
