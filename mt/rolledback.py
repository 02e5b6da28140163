"""A script's side of a rollback (`mt rollback` on a script's run, docs/library.md#rollback): the
pending request (mt/contract/rollback.py) becomes `run.resume_from` (the newest reported checkpoint
at or before its step), `run.skip_batches` and `run.lr_scale`, which the script applies itself."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mt.contract import rollback as contract
from mt.contract.checkpoints import reported, reported_at
from mt.contract.paths import RunPaths


def resume_point(paths: RunPaths, usable: bool) -> tuple[Path | None, contract.Rollback | None]:
    """(the checkpoint this attempt resumes from, the rollback it makes or None)."""
    if not usable:
        return None, None
    rb = contract.read_request(paths)
    if rb is None:
        return reported(paths.events), None
    found = reported_at(paths.events, rb.to_step)
    if found is None:  # none left at or before it (deleted since): an ordinary resume, said in the event's why
        return reported(paths.events), None
    return found[0], contract.Rollback(rb.step, found[1], rb.skip_batches, rb.lr_scale, rb.why, rb.by, rb.count)


def announce(events: Any, rb: contract.Rollback) -> None:
    """The `rollback` event (rank 0, after run_start), as the engine writes it."""
    events.emit("rollback", **{**rb.fields(), "lr_scale": rb.lr_scale if rb.lr_scale is not None else 1.0})


def spent(paths: RunPaths, rb: contract.Rollback | None) -> None:
    """A checkpoint reported after the rollback holds it (the script saves its own position): the request is done."""
    if rb is not None:
        contract.clear_request(paths)
