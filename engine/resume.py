"""Where an attempt continues: rank 0 picks the newest intact checkpoint, every rank gets the same copy."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine import checkpoint
from engine.dist import DistEnv, log
from mt.paths import RunPaths


def find_checkpoint(paths: RunPaths, env: DistEnv, events: Any, where: torch.device) -> tuple[str, dict[str, Any], list[tuple[str, str]]] | None:
    """(path, parts, skipped) of the checkpoint this attempt resumes from, on every rank, its tensors
    on `where`; None: a fresh start.

    Rank 0 removes a dead writer's temporaries, skips damaged checkpoints (one `checkpoint_skipped`
    incident each) and tells the others which one it chose (a collective)."""
    found: list[Any] = [None, [], None, None]
    parts = None
    if env.is_main:
        checkpoint.clean_temporaries(paths.checkpoints)
        path, parts, skipped = checkpoint.find_latest(paths.checkpoints, where)
        manifest = checkpoint.verify(path, hashes=False)["files"] if path else None  # just verified: sizes suffice
        found = [str(path) if path else None, [(str(p), why) for p, why in skipped], path.name if path else None, manifest]
        for p, why in skipped:
            log(f"skipping checkpoint {p}: {why}")
            events.emit("incident", step=0, code="checkpoint_skipped", severity="warn", title="Checkpoint skipped on resume",
                        detail=why, advice="The newest intact checkpoint is used instead; inspect or delete the damaged folder.",
                        evidence={"path": str(p)})
    dist.broadcast_object_list(found, src=0)
    if found[0] is None:
        return None
    return found[0], _share(paths.checkpoints / found[2], found[3], parts, env, where), found[1]


def _share(path: Path, files: dict[str, Any], parts: dict[str, Any] | None, env: DistEnv, where: torch.device) -> dict[str, Any]:
    """Every rank's copy of the checkpoint rank 0 chose: read from its own run directory where
    the same checkpoint is there (one node, shared filesystem), else sent by rank 0."""
    try:
        same = checkpoint.verify(path, hashes=False)["files"] == files
    except checkpoint.CheckpointError:  # not here, or not the same: rank 0 sends it
        same = False
    visible = torch.tensor([float(same)], device=env.device)
    dist.all_reduce(visible, op=dist.ReduceOp.MIN)
    if bool(visible.item()):
        return parts if parts is not None else checkpoint.load(path, map_location=where)
    box = [{k: _to_cpu(v) for k, v in parts.items()} if parts is not None else None]
    dist.broadcast_object_list(box, src=0)
    if not same:
        log(f"{path} is not in this run directory: received the checkpoint from rank 0")
    return box[0]


def _to_cpu(obj: Any) -> Any:
    """A state tree with every tensor on the CPU, so it can travel through broadcast_object_list."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
