"""A rollback: the run continues from an earlier checkpoint, skipping batches of the data order,
with its learning rate scaled (docs/checkpoints.md#rollback). Stdlib only.

Whoever decides (`mt rollback`, the dashboard, the engine's `on_nan`/`on_spike = "rollback"`)
writes `rollback.json`; the next attempt's rank 0 sets the checkpoints after `to_step` aside
(checkpoints/abandoned/), resumes from the newest intact one at or before it, moves the samples
position and the knobs, and emits the `rollback` event. The file stays until a checkpoint holds the
rollback (its manifest's `rollbacks` >= `count`), so an attempt that dies before one is written
makes the same rollback again: the same path, bit for bit."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mt.contract import door, knobs
from mt.contract.checkpoints import CheckpointError, folder_name, folders, read_manifest
from mt.contract.jsonl import write_json_atomic
from mt.contract.paths import RunPaths

BY = ("user", "on_nan", "on_spike")
RUN_END = "rolled_back"  # the run_end status of an attempt that ended to roll back: the supervisor starts the next
ABANDONED = "abandoned"  # checkpoints/abandoned/<count>-step-<S>: the steps a rollback left behind (never read back)


@dataclass(frozen=True)
class Rollback:
    """One rollback: the `rollback` event's fields (docs/events.md#rollback)."""

    step: int                # the step the run had reached
    to_step: int             # the checkpoint it goes back to (the newest intact one at or before it is used)
    skip_batches: int        # batches of the data order skipped from there (samples += N x global batch)
    lr_scale: float | None   # the learning-rate knob from there on; None: the checkpoint's is kept
    why: str
    by: str                  # BY
    count: int               # rollbacks so far in this run, this one included

    def fields(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, obj: Any) -> Rollback | None:
        """A request file's value checked; None for anything else (an old or hand-edited file)."""
        if not isinstance(obj, dict):
            return None
        try:
            lr = obj.get("lr_scale")
            rb = cls(int(obj["step"]), int(obj["to_step"]), int(obj["skip_batches"]),
                     None if lr is None else float(knobs.check("lr_scale", lr)), str(obj.get("why", "")),
                     str(obj.get("by", "user")), int(obj["count"]))
        except (KeyError, TypeError, ValueError):
            return None
        return rb if rb.to_step >= 0 and rb.skip_batches >= 0 and rb.count >= 1 and rb.by in BY else None


def read_request(paths: RunPaths) -> Rollback | None:
    """The rollback the next attempt is to make, if any (through the door)."""
    return Rollback.parse(door.read_json(paths.rollback))


def write_request(paths: RunPaths, rb: Rollback) -> None:
    write_json_atomic(paths.rollback, rb.fields())


def clear_request(paths: RunPaths) -> None:
    paths.rollback.unlink(missing_ok=True)


def rollbacks_of(manifest: dict[str, Any]) -> int:
    """The rollbacks a checkpoint's timeline had made (0 before any, or in a checkpoint older than rollbacks)."""
    value = manifest.get("rollbacks", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def held(root: Path, count: int) -> bool:
    """Whether a checkpoint already holds rollback number `count` (so its request is spent)."""
    for _, path in folders(root):
        try:
            if rollbacks_of(read_manifest(path)) >= count:
                return True
        except CheckpointError:
            continue
    return False


def newest_count(paths: RunPaths) -> int:
    """The rollbacks this run has made: its newest checkpoint's count, or a pending request's."""
    count = 0
    for _, path in folders(paths.checkpoints):
        try:
            count = rollbacks_of(read_manifest(path))
            break
        except CheckpointError:
            continue
    pending = read_request(paths)
    return max(count, pending.count if pending else 0)


def set_aside(root: Path, to_step: int, count: int) -> list[Path]:
    """Move every checkpoint after `to_step` into checkpoints/abandoned/ (kept, never resumed from);
    returns where they went. Idempotent: a second call finds nothing left to move."""
    moved = []
    for s, path in folders(root):
        if s <= to_step:
            break
        dest = root / ABANDONED / f"{count}-{folder_name(s)}"
        dest.parent.mkdir(exist_ok=True)
        if dest.exists():  # the same rollback made twice (an attempt died before its checkpoint): keep the first
            dest = dest.with_name(f"{dest.name}-{os.getpid()}")
        os.replace(path, dest)
        moved.append(dest)
    return moved


def skip_for(configured: int, step: int, to_step: int) -> int:
    """The batches to skip: `configured` when > 0, else every batch from the checkpoint through the
    step the run had reached (the stretch that went wrong is never fed again)."""
    return configured if configured > 0 else max(1, step - to_step)
