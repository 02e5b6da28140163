"""Atomic, self-checking checkpoints: write to a temporary folder, fsync, rename into place.

A checkpoint is `checkpoints/step-<S>/` holding model.pt, optim.pt, train.pt and, written last,
manifest.json with the sha256 and size of each file. Loading verifies the manifest and reads
every file with `torch.load(weights_only=True)`, so a checkpoint can never run code.

`save_and_prune` first checks that the new checkpoint fits (the previous one's size); when it
does not, it deletes early what retention would delete after the save anyway, but never the
newest intact checkpoint; if it still does not fit it raises DiskFullError and writes nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import torch

from mt import fmt, space

# the format and its check live in mt (stdlib only), so `mt resume` verifies without torch
from mt.ckptfile import FILES, FORMAT, FORMAT_VERSION, CheckpointError, intact, verify
from mt.paths import checkpoint_dirs, checkpoint_step
from mt.space import DiskFullError, clean_temporaries  # noqa: F401 - clean_temporaries: part of this API


@dataclass
class Saved:
    path: Path
    bytes: int
    seconds: float
    pruned: list[Path] = field(default_factory=list)


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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_of(path: Path) -> int | None:
    return checkpoint_step(path.name)


def save(root: Path, step: int, parts: dict[str, Any], meta: dict[str, Any], after_file: Callable[[str], None] | None = None,
         needed: int | None = None) -> Saved:
    """Write `parts` (file name -> object) as checkpoint `step`; returns where and how big.

    `after_file(name)` runs after each file is on disk (the fault injector dies there). On any
    error the temporary folder is removed; a full disk raises DiskFullError (`needed`: a hint)."""
    return commit(root, step, begin(root, step), lambda tmp: write_parts(tmp, parts, after_file), meta, needed)


def begin(root: Path, step: int) -> Path:
    """The empty temporary folder checkpoint `step` is written into (any leftover of that name removed)."""
    root.mkdir(exist_ok=True)  # never parents: a deleted run directory must stay deleted
    tmp = root / f".tmp-step-{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    return tmp


def commit(root: Path, step: int, tmp: Path, write: Callable[[Path], dict[str, Any]], meta: dict[str, Any],
           needed: int | None = None, t0: float | None = None) -> Saved:
    """Finish the files in `tmp` (`write` returns the manifest's files), write the manifest, rename into place.

    On any error the temporary folder is removed (never renamed); a full disk raises DiskFullError."""
    t0 = time.perf_counter() if t0 is None else t0
    final = root / f"step-{step}"
    try:
        files = write(tmp)
        _write_manifest(tmp, step, files, meta)
    except Exception as e:
        raise discard(tmp, root, step, e, needed) from e
    if final.exists():  # an older timeline's folder of the same step: replace it whole
        trash = root / f".trash-step-{step}-{os.getpid()}"
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, final)
    _fsync_dir(root)
    total = sum(f["bytes"] for f in files.values())
    return Saved(final, total, time.perf_counter() - t0)


def discard(tmp: Path, root: Path, step: int, e: BaseException, needed: int | None = None) -> BaseException:
    """Remove a half-written checkpoint; the error to raise (a full disk becomes DiskFullError)."""
    written = space.disk_usage(tmp)
    # measured before the removal: torch's C++ writer (DCP's shards) loses the ENOSPC and says
    # only "unexpected pos", but a filesystem left without room by this write is a full disk
    full = space.is_disk_full(e) or space.no_room_left(root)
    shutil.rmtree(tmp, ignore_errors=True)  # a half-written folder would keep the space
    if full:
        wrote = f" ({fmt.human_bytes(written)} written when the disk filled)" if written else ""
        return space.disk_full(f"checkpoint step-{step}{wrote}", root, needed)
    return e


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


def hash_files(folder: Path, names: list[str]) -> dict[str, Any]:
    """{name: {sha256, bytes}} of files already written (DCP's shards and .metadata)."""
    files = {}
    for name in names:
        sha, size = hashlib.sha256(), 0
        with open(folder / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
                size += len(block)
        files[name] = {"sha256": sha.hexdigest(), "bytes": size}
    return files


def _write_manifest(tmp: Path, step: int, files: dict[str, Any], meta: dict[str, Any]) -> None:
    """manifest.json last, fsynced, then the folder itself."""
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "step": step, "files": files, "created": time.time(), **meta}
    with open(tmp / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)


def save_and_prune(root: Path, step: int, parts: dict[str, Any], meta: dict[str, Any], keep_last: int,
                   after_file: Callable[[str], None] | None = None) -> Saved:
    """save() with retention: make room first if the disk needs it, prune after.

    Raises DiskFullError, having written and deleted nothing, when even pruning first would not
    make room."""
    room = make_room(root, step, keep_last)
    saved = save(root, step, parts, meta, after_file, room.needed)
    saved.pruned = room.prune_first + prune(root, keep_last, saved.path)
    return saved


def make_room(root: Path, step: int, keep_last: int) -> space.Room:
    """Delete early what retention would delete after this save when the disk needs it; raises
    DiskFullError, having deleted nothing, when even that would not make room."""
    room = space.plan_room(root, step, keep_last, intact)
    if not room.fits:
        kept = f"keep_last = {keep_last} keeps {room.kept} older checkpoint{'s' * (room.kept != 1)} beside it"
        if keep_last == 1:
            kept = "keep_last = 1 keeps the newest intact checkpoint until the new one is written"
        raise space.disk_full(f"checkpoint step-{step} ({kept})", root, room.needed)
    for p in room.prune_first:
        shutil.rmtree(p, ignore_errors=True)
    return room


def candidates(root: Path) -> list[Path]:
    """Checkpoint folders, newest step first (temporary, foreign and symlinked names ignored)."""
    return [p for _, p in checkpoint_dirs(root)]


def find_latest(root: Path, map_location: torch.device | str = "cpu") -> tuple[Path | None, dict[str, Any] | None, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies and loads, its parts, and (folder, reason) for each one skipped."""
    skipped = []
    for path in candidates(root):
        try:
            verify(path)
            return path, load(path, map_location), skipped
        except CheckpointError as e:
            skipped.append((path, str(e)))
    return None, None, skipped


def load(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Every part of a verified checkpoint; anything that would need unpickling code is refused.

    A sharded checkpoint gives train.pt and `sharded`, its DCP metadata (read without running
    code) after its byte items passed weights_only here, so one refused is a checkpoint skipped
    while choosing; the shards themselves are read by every rank (engine/sharded.py `load`)."""
    if verify_layout(path) == "sharded":
        from engine import sharded  # DCP is imported only where a sharded checkpoint is read
        md = sharded.read_metadata(path)
        sharded.read_byte_items(path, md)
        return {"train.pt": _load_file(path, "train.pt", "cpu"), "sharded": md}
    return {name: _load_file(path, name, map_location) for name in FILES}


def verify_layout(path: Path) -> str:
    """The layout a checkpoint's manifest names ("full" for manifests written before there were two)."""
    return verify(path, hashes=False)["layout"]


def _load_file(path: Path, name: str, map_location: torch.device | str) -> Any:
    # RNG states must stay CPU tensors (torch.set_rng_state takes no others)
    where = "cpu" if name == "train.pt" else map_location
    try:
        return torch.load(path / name, map_location=where, weights_only=True)
    except Exception as e:  # noqa: BLE001 - weights_only refuses pickled code with UnpicklingError, and more
        raise CheckpointError(f"{path}/{name}: refused by weights_only load: {type(e).__name__}: {e}") from None


def prune(root: Path, keep_last: int, newest: Path) -> list[Path]:
    """Delete checkpoints older than the newest `keep_last` up to `newest`; never `newest` itself."""
    newest_step = step_of(newest)
    older = [p for p in candidates(root) if p != newest and (step_of(p) or 0) < (newest_step or 0)]
    doomed = older[max(0, keep_last - 1):]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


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
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
