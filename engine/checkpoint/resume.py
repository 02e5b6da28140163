"""Where an attempt starts: the newest intact checkpoint (full or sharded, any world size), else
init_from's weights, else step 0. The loop calls `choose_start` before wrapping the model and
`start_position` after building its optimizer."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine import parallel
from engine.checkpoint import full, sharded
from engine.checkpoint.pick import find_checkpoint
from engine.dist import DistEnv, log, seed_everything
from engine.weights import fit_problems, load_into, read_state
from mt.contract.attempt import ResumeRefused, plan
from mt.contract.checkpoints import CheckpointError
from mt.contract.config import Config
from mt.contract.knobs import Knobs
from mt.contract.paths import RunPaths

Found = tuple[str, dict[str, Any], list[tuple[str, str]]]
"""(path, parts, skipped) of the checkpoint an attempt resumes from (engine/checkpoint/pick.py)."""


@dataclass
class Position:
    """Where the loop starts: its step, the samples already seen, its accumulation, the
    run_start's `resumed_from` (None for a fresh start) and the knobs turned before it."""

    step: int
    samples: int
    accum: int
    resumed_from: dict[str, Any] | None
    knobs: Knobs = field(default_factory=Knobs)
    rollbacks: int = 0  # rollbacks made on the way to it (mt/contract/rollback.py)


def choose_start(cfg: Config, env: DistEnv, paths: RunPaths, events: Any, model: nn.Module,
                 load_device: torch.device) -> Found | None:
    """The checkpoint to resume from (applied by `start_position`), else init_from's weights loaded
    now, while the model is whole (before sharding)."""
    found = find_checkpoint(paths, env, events, load_device)
    if found is None and cfg.model.init_from:
        state, source = read_state(Path(cfg.model.init_from))
        load_into(model, {k: v.to(load_device) for k, v in state.items()}, source)
        log(f"weights from {source} (model.init_from); step 0, fresh optimizer")
    return found


def start_position(found: Found | None, cfg: Config, env: DistEnv, model: nn.Module, wrapped: parallel.Parallel,
                   optimizer: torch.optim.Optimizer, scaler: Any) -> Position:
    """A fresh start (per-rank dropout streams), or the checkpoint's model, optimizer, scaler, RNG and
    position loaded: either format resumes under either strategy and world size."""
    t = cfg.train
    if found is None:
        seed_everything(cfg.run.seed + env.rank)
        return Position(0, 0, t.grad_accum_steps, None)
    path, parts, skipped = found
    state = parts["train.pt"]
    how = plan(state, env.world_size, t.micro_batch_size, t.grad_accum_steps, t.allow_batch_change)
    md = parts.get("sharded")
    misfit = fit_problems(model, sharded.model_shapes(md) if md is not None else parts["model.pt"], "the checkpoint")
    if misfit:  # the [model] section changed since the checkpoint was written
        raise ResumeRefused(f"{path} does not fit the model: {'; '.join(misfit)}")
    if md is not None:
        try:
            sharded.load(Path(path), model, optimizer)  # collective; DCP reshards
        except CheckpointError as e:
            raise ResumeRefused(str(e)) from None
        scaler.load_state_dict(state["scaler"])
    else:
        parallel.load_full_state(wrapped, model, optimizer, parts["model.pt"], parts["optim.pt"]["optimizer"])
        scaler.load_state_dict(parts["optim.pt"]["scaler"])
    step, samples = int(state["step"]), int(state["samples_seen"])
    rngs = state["rng"]
    if env.rank < len(rngs):
        full.restore_rng(rngs[env.rank], env.device)
    else:  # a rank the checkpoint did not have: fresh but reproducible streams
        seed_everything(cfg.run.seed + env.rank + 1000 * step)
    log(f"resumed from {path} at step {step}: {how.note}")
    knobs = Knobs.from_state(state.get("knobs"))
    rollbacks = state.get("rollbacks", 0)
    return Position(step, samples, how.grad_accum_steps, knobs=knobs, rollbacks=rollbacks if isinstance(rollbacks, int) else 0, resumed_from={
        "path": path, "step": step, "samples_seen": samples, "world_size_before": int(state["world_size"]),
        "grad_accum_before": int(state["grad_accum_steps"]), "grad_accum_now": how.grad_accum_steps,
        "exact": how.exact, "note": how.note, "skipped": skipped})
