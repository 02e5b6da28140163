"""The folder protocol every checkpoint is written by: a temporary folder, fsync, rename into place.

A checkpoint is `checkpoints/step-<S>/` holding its files and, written last, manifest.json with
the sha256 and size of each; what the files are is the layout's (full.py, sharded.py).
`make_room` first checks that the new checkpoint fits (the previous one's size); when it does
not, it deletes early what retention would delete after the save anyway, but never the newest
intact checkpoint; if it still does not fit it raises DiskFullError and deletes nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mt.contract import door, fmt, space
from mt.contract.checkpoints import FORMAT, FORMAT_VERSION, best, folder_name, folders, step_of


@dataclass
class Saved:
    path: Path
    bytes: int
    seconds: float
    pruned: list[Path] = field(default_factory=list)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def begin(root: Path, step: int) -> Path:
    """The empty temporary folder checkpoint `step` is written into (any leftover of that name removed)."""
    root.mkdir(exist_ok=True)  # never parents: a deleted run directory must stay deleted
    tmp = root / f".tmp-{folder_name(step)}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    return tmp


def commit(root: Path, step: int, tmp: Path, write: Callable[[Path], dict[str, Any]], meta: dict[str, Any],
           needed: int | None = None, t0: float | None = None) -> Saved:
    """Finish the files in `tmp` (`write` returns the manifest's files), write the manifest, rename into place.

    On any error the temporary folder is removed (never renamed); a full disk raises DiskFullError."""
    t0 = time.perf_counter() if t0 is None else t0
    final = root / folder_name(step)
    try:
        files = write(tmp)
        _write_manifest(tmp, step, files, meta)
    except Exception as e:
        raise discard(tmp, root, step, e, needed) from e
    if final.exists():  # an older timeline's folder of the same step: replace it whole
        trash = root / f".trash-{folder_name(step)}-{os.getpid()}"
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
        return space.disk_full(f"checkpoint {folder_name(step)}{wrote}", root, needed)
    return e


def hash_files(folder: Path, names: list[str]) -> dict[str, Any]:
    """{name: {sha256, bytes}} of files already written (DCP's shards and .metadata)."""
    files = {}
    for name in names:
        sha, size = hashlib.sha256(), 0
        # files DCP just wrote here; a link is followed (never a FIFO or device): verify() refuses links
        with door.open_file(folder / name, follow=True) as f:
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


def make_room(root: Path, step: int, keep_last: int) -> space.Room:
    """Delete early what retention would delete after this save when the disk needs it; raises
    DiskFullError, having deleted nothing, when even that would not make room."""
    room = space.plan_room(root, step, keep_last)
    if not room.fits:
        kept = f"keep_last = {keep_last} keeps {room.kept} older checkpoint{'s' * (room.kept != 1)} beside it"
        if keep_last == 1:
            kept = "keep_last = 1 keeps the newest intact checkpoint until the new one is written"
        raise space.disk_full(f"checkpoint {folder_name(step)} ({kept})", root, room.needed)
    for p in room.prune_first:
        shutil.rmtree(p, ignore_errors=True)
    return room


def prune(root: Path, keep_last: int, newest: Path) -> list[Path]:
    """Delete checkpoints older than the newest `keep_last` up to `newest`; never `newest` itself,
    nor the best ones `[checkpoint] keep_best` keeps (their manifests say which)."""
    newest_step = step_of(newest.name) or 0
    kept = {b.path for b in best(root)}
    older = [p for s, p in folders(root) if p != newest and s < newest_step]
    doomed = [p for p in older[max(0, keep_last - 1):] if p not in kept]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed
