"""The engine's side of a rollback (mt/contract/rollback.py, docs/checkpoints.md#rollback): at the
start of an attempt, the pending rollback is made (checkpoints after it set aside, the position and
knobs moved); on a NaN or a spike with `on_nan`/`on_spike = "rollback"`, one is planned and the
attempt ends so the next one makes it.

Why a new attempt rather than a reload in place: the new attempt goes through the one resume path
(model, optimizer, scaler, every rank's RNG, a fresh sampler and loader at the moved position), so
a rolled-back run is exactly a resume, and a later kill and resume follow it bit for bit."""
from __future__ import annotations

from typing import Any

import torch.distributed as dist

from engine.checkpoint.resume import Position
from engine.dist import DistEnv, log
from mt.contract import checkpoints
from mt.contract import rollback as contract
from mt.contract.config import TrainConfig
from mt.contract.incident import Incident
from mt.contract.paths import RunPaths
from mt.contract.rollback import Rollback

RUN_END = contract.RUN_END


def begin(paths: RunPaths, env: DistEnv) -> Rollback | None:
    """The rollback this attempt makes, on every rank (a collective): rank 0 reads the request, drops
    a spent one, and sets the checkpoints after its `to_step` aside before the checkpoint is picked."""
    box: list[Any] = [None]
    if env.is_main:
        rb = contract.read_request(paths)
        if rb is not None and contract.held(paths.checkpoints, rb.count):
            contract.clear_request(paths)  # a checkpoint after it holds it already: spent
            rb = None
        if rb is not None:
            moved = contract.set_aside(paths.checkpoints, rb.to_step, rb.count)
            log(f"rollback {rb.count} to step {rb.to_step} ({rb.why}); set aside: {[p.name for p in moved]}")
        box = [rb.fields() if rb else None]
    dist.broadcast_object_list(box, src=0, group=env.host_group)
    return Rollback.parse(box[0])


def settle(paths: RunPaths, env: DistEnv) -> None:
    """At an attempt's end (rank 0): the pending request removed once a checkpoint holds it; never
    one this attempt has just written for the next (on_nan), which no checkpoint holds yet."""
    pending = contract.read_request(paths) if env.is_main else None
    if pending is not None and contract.held(paths.checkpoints, pending.count):
        contract.clear_request(paths)


def apply(rb: Rollback, start: Position, global_batch: int) -> float:
    """The resumed position moved: `skip_batches` global batches further in the data order, the
    lr knob set, the count kept (every checkpoint after this holds all three); returns the lr knob before."""
    before = start.knobs.lr_scale
    start.samples += rb.skip_batches * global_batch
    if rb.lr_scale is not None:
        start.knobs.lr_scale = rb.lr_scale
    start.rollbacks = rb.count
    return before


def announce(events: Any, rb: Rollback, to_step: int, lr_scale: float, lr_before: float) -> None:
    """The `rollback` event (and a `knob` event where it turned the lr knob), and the incident that says
    what was done (to_step: the checkpoint used; lr_scale: the knob from there on, lr_before before it)."""
    fields = {**rb.fields(), "to_step": to_step, "lr_scale": lr_scale}
    events.emit("rollback", **fields)
    if rb.lr_scale is not None:  # the plots mark it and the header shows it as any turned knob
        events.emit("knob", step=to_step + 1, key="lr_scale", value=lr_scale, previous=lr_before, by="rollback", request=None)
    lr = f", lr scaled by {rb.lr_scale:g}" if rb.lr_scale is not None else ""
    detail = (f"rolled back from step {rb.step} to the checkpoint of step {to_step}, skipping the next "
              f"{rb.skip_batches} batches{lr} ({rb.why}; by {rb.by}, rollback {rb.count} of this run)")
    events.emit("incident", **Incident("rolled_back", "warn", to_step, f"Rolled back to step {to_step}", detail,
                                       "Watch the loss after it; `mt rollback` again with --skip-batches or --lr-scale "
                                       "if the stretch goes wrong again.", fields).event_fields())


def plan(paths: RunPaths, step: int, done: int, t: TrainConfig, by: str, why: str) -> Rollback | str:
    """Rank 0: the automatic rollback for a bad `step` (the request written), or why there is none."""
    target = checkpoints.newest(paths.checkpoints, "sizes", at_most=step - 1)  # the next attempt verifies every byte
    no = f"the rollback budget is spent (train.rollback_budget = {t.rollback_budget})" if done >= t.rollback_budget \
        else None if target.step is not None else f"no checkpoint before step {step} to roll back to"
    if no is not None:
        log(f"{why} at step {step}: no rollback: {no}")
        return no
    assert target.step is not None
    rb = Rollback(step, target.step, contract.skip_for(t.rollback_skip_batches, step, target.step), None, why, by, done + 1)
    contract.write_request(paths, rb)
    log(f"{why} at step {step}: rolling back to step {target.step}, skipping {rb.skip_batches} batches")
    return rb


def after_nan(paths: RunPaths, env: DistEnv, step: int, done: int, t: TrainConfig) -> tuple[bool, str]:
    """Every rank: (whether this NaN step rolls back, the run_end reason); rank 0 decides and writes
    the request, and when it cannot (no checkpoint, the budget spent) the run stops, saying why."""
    box: list[Any] = [None]
    if env.is_main:
        got = plan(paths, step, done, t, "on_nan", "non-finite loss")
        box = [(True, f"rolling back to step {got.to_step} after a non-finite loss at step {step}") if isinstance(got, Rollback)
               else (False, f"non-finite loss at step {step} with train.on_nan = \"rollback\", but {got}")]
    dist.broadcast_object_list(box, src=0, group=env.host_group)
    return box[0]
