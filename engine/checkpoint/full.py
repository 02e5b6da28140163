"""The full layout: whole state dicts as model.pt, optim.pt and train.pt, written by rank 0.

Each part is streamed through torch.save into a hashing writer (no second read) and read back
with `torch.load(weights_only=True)`, so a checkpoint can never run code. train.pt (the position
and every rank's RNG state, `capture_rng`) is written this way in the sharded layout too.
"""
from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import torch

from engine.checkpoint import folder
from mt.contract import door
from mt.contract.checkpoints import FILES, CheckpointError


class _HashingWriter:
    """A file wrapper that hashes what torch.save streams through it (no second read)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0
        self.error: OSError | None = None

    def write(self, b: bytes) -> int:
        self.sha.update(b)
        self.size += len(b)
        try:
            return self.f.write(b)
        except OSError as e:  # torch reports it only as "unexpected pos": keep the real cause
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def save(root: Path, step: int, parts: dict[str, Any], meta: dict[str, Any], after_file: Callable[[str], None] | None = None,
         needed: int | None = None) -> folder.Saved:
    """Write `parts` (file name -> object) as checkpoint `step`; returns where and how big.

    `after_file(name)` runs after each file is on disk (the fault injector dies there). On any
    error the temporary folder is removed; a full disk raises DiskFullError (`needed`: a hint)."""
    tmp = folder.begin(root, step)
    return folder.commit(root, step, tmp, lambda t: write_parts(t, parts, after_file), meta, needed)


def save_and_prune(root: Path, step: int, parts: dict[str, Any], meta: dict[str, Any], keep_last: int,
                   after_file: Callable[[str], None] | None = None) -> folder.Saved:
    """save() with retention: make room first if the disk needs it, prune after.

    Raises DiskFullError, having written and deleted nothing, when even pruning first would not
    make room."""
    room = folder.make_room(root, step, keep_last)
    saved = save(root, step, parts, meta, after_file, room.needed)
    saved.pruned = room.prune_first + folder.prune(root, keep_last, saved.path)
    return saved


def write_parts(tmp: Path, parts: dict[str, Any], after_file: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Each part through torch.save into tmp, fsynced; returns {name: {sha256, bytes}}."""
    files = {}
    for name, obj in parts.items():
        with open(tmp / name, "wb") as f:
            w = _HashingWriter(f)
            try:
                torch.save(obj, w)
            except RuntimeError as e:
                if w.error is not None:  # torch's "[enforce fail ...] unexpected pos": the write failed
                    raise w.error from e
                raise
            f.flush()
            os.fsync(f.fileno())
        files[name] = {"sha256": w.sha.hexdigest(), "bytes": w.size}
        if after_file:
            after_file(name)
    return files


def load(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Every part of a verified full checkpoint; anything that would need unpickling code is refused."""
    return {name: load_file(path, name, map_location) for name in FILES}


def load_file(path: Path, name: str, map_location: torch.device | str) -> Any:
    """One part through weights_only torch.load (train.pt always to the CPU); CheckpointError if refused."""
    # RNG states must stay CPU tensors (torch.set_rng_state takes no others)
    where = "cpu" if name == "train.pt" else map_location
    try:
        with door.open_file(path / name) as f:
            return torch.load(f, map_location=where, weights_only=True)
    except Exception as e:  # noqa: BLE001 - weights_only refuses pickled code with UnpicklingError, and more
        raise CheckpointError(f"{path}/{name}: refused by weights_only load: {type(e).__name__}: {e}") from None


def capture_rng(device: torch.device) -> dict[str, Any]:
    """This process's RNG states as plain types and tensors (weights_only-safe: no numpy objects)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(gauss)],
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Set this process's RNG streams to what `capture_rng` returned."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
