"""Where an attempt continues: rank 0 picks the newest checkpoint that verifies and loads (either
layout), every rank gets the same copy."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.checkpoint import full, sharded
from engine.dist import DistEnv, log
from mt.contract import checkpoints, space
from mt.contract.incident import Incident
from mt.contract.paths import RunPaths


def find_checkpoint(paths: RunPaths, env: DistEnv, events: Any, where: torch.device) -> tuple[str, dict[str, Any], list[tuple[str, str]]] | None:
    """(path, parts, skipped) of the checkpoint this attempt resumes from, on every rank, its tensors
    on `where`; None: a fresh start.

    Rank 0 removes a dead writer's temporaries, skips damaged checkpoints (one `checkpoint_skipped`
    incident each) and tells the others which one it chose (a collective)."""
    found: list[Any] = [None, [], None, None]
    parts = None
    if env.is_main:
        space.clean_temporaries(paths.checkpoints)
        path, parts, skipped, manifest = _latest(paths.checkpoints, where)
        found = [str(path) if path else None, [(str(p), why) for p, why in skipped], path.name if path else None,
                 manifest["files"] if path else None]
        for p, why in skipped:
            log(f"skipping checkpoint {p}: {why}")
            events.emit("incident", **Incident("checkpoint_skipped", "warn", 0, "Checkpoint skipped on resume", why,
                                                "The newest intact checkpoint is used instead; inspect or delete the damaged folder.",
                                                {"path": str(p)}).event_fields())
    dist.broadcast_object_list(found, src=0, group=env.host_group)  # the host group: rank 0 hashes for as long as it takes
    if found[0] is None:
        return None
    return found[0], _share(paths.checkpoints / found[2], found[3], parts, env, where), found[1]


def find_latest(root: Path, map_location: torch.device | str = "cpu") -> tuple[Path | None, dict[str, Any] | None, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies and loads, its parts, and (folder, reason) for each one skipped."""
    path, parts, skipped, _ = _latest(root, map_location)
    return path, parts, skipped


def _latest(root: Path, where: torch.device | str) -> tuple[Path | None, dict[str, Any] | None, list[tuple[Path, str]], dict[str, Any]]:
    loaded: dict[str, Any] = {}

    def loads(path: Path, manifest: dict[str, Any]) -> None:  # a part weights_only refuses: skipped, as a damaged one
        loaded.update(_load(path, manifest["layout"], where))

    found = checkpoints.newest(root, "sha256", loads)
    return found.path, loaded if found.path else None, [(d.path, d.message) for d in found.damaged], found.manifest


def load(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Every part of a checkpoint (sizes verified here); anything that would need unpickling code is refused."""
    return _load(path, checkpoints.verify(path, hashes=False)["layout"], map_location)


def _load(path: Path, layout: str, where: torch.device | str) -> dict[str, Any]:
    """A sharded checkpoint gives train.pt and `sharded`, its DCP metadata (read without running
    code) after its byte items passed weights_only here, so one refused is a checkpoint skipped
    while choosing; the shards themselves are read by every rank (sharded.py `load`)."""
    if layout == "sharded":
        md = sharded.read_metadata(path)
        sharded.read_byte_items(path, md)
        return {"train.pt": full.load_file(path, "train.pt", "cpu"), "sharded": md}
    return full.load(path, where)


def _share(path: Path, files: dict[str, Any], parts: dict[str, Any] | None, env: DistEnv, where: torch.device) -> dict[str, Any]:
    """Every rank's copy of the checkpoint rank 0 chose: read from its own run directory where
    the same checkpoint is there (one node, shared filesystem), else sent by rank 0."""
    try:
        same = checkpoints.verify(path, hashes=False)["files"] == files
    except checkpoints.CheckpointError:  # not here, or not the same: rank 0 sends it
        same = False
    visible = torch.tensor([float(same)])
    dist.all_reduce(visible, op=dist.ReduceOp.MIN, group=env.host_group)
    if bool(visible.item()):
        return parts if parts is not None else load(path, map_location=where)
    received = _broadcast(parts, env)
    if not same:
        log(f"{path} is not in this run directory: received the checkpoint from rank 0")
    return received


CHUNK_BYTES = 64 << 20
"""A checkpoint travels from rank 0 in pieces of at most this size, over the host group (gloo, CPU memory)."""


def _broadcast(parts: dict[str, Any] | None, env: DistEnv) -> dict[str, Any]:
    """Rank 0's parts on every rank: serialized once on rank 0, sent in CHUNK_BYTES pieces over the host
    group (never staged whole on a GPU, as broadcast_object_list does under NCCL), read back with weights_only."""
    group = env.host_group
    box = [parts.get("sharded") if parts is not None else None]  # a sharded layout's DCP metadata: small
    dist.broadcast_object_list(box, src=0, group=group)
    data = memoryview(b"")
    if parts is not None:
        buf = io.BytesIO()
        torch.save({k: _to_cpu(v) for k, v in parts.items() if k != "sharded"}, buf)
        data = buf.getbuffer()
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, src=0, group=group)
    received = bytearray(int(size.item())) if parts is None else None
    for at in range(0, int(size.item()), CHUNK_BYTES):
        n = min(CHUNK_BYTES, int(size.item()) - at)
        chunk = torch.frombuffer(data, dtype=torch.uint8, offset=at, count=n) if parts is not None else torch.empty(n, dtype=torch.uint8)
        dist.broadcast(chunk, src=0, group=group)
        if received is not None:
            received[at:at + n] = chunk.numpy().tobytes()
    if parts is not None:
        return parts
    assert received is not None
    got = torch.load(io.BytesIO(received), map_location="cpu", weights_only=True)
    return {**got, "sharded": box[0]} if box[0] is not None else got


def _to_cpu(obj: Any) -> Any:
    """A state tree with every tensor on the CPU, so it can be serialized for the host group."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
