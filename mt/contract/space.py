"""Disk space: how much is free where, whether an error means "disk full", and how to say so.

Stdlib only: the supervisor and `mt resume` use it as well as the engine's checkpointing.
"""
from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mt.contract import door
from mt.contract.fmt import human_bytes

# What the supervisor keeps allocated in every run directory (RunPaths.reserve) and deletes to
# make room for the final status.json when the disk is full (a status file is a few KiB).
RESERVE_BYTES = 256 * 1024
# Beyond the previous checkpoint's size: its manifest, block rounding of each file, a few events.
SLACK_BYTES = 64 * 1024
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """No room for something the run must write; str() says where, how much is free and needed."""

    def __init__(self, message: str, path: Path, free: int | None, needed: int | None) -> None:
        super().__init__(errno.ENOSPC, message)
        self.message, self.path, self.free, self.needed = message, Path(path), free, needed

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple:
        # pickled across ranks (torch.distributed's *_object collectives): OSError's own reduce
        # would call __init__ with (errno, message)
        return type(self), (self.message, self.path, self.free, self.needed)


def is_disk_full(exc: BaseException | None, _depth: int = 0) -> bool:
    """Whether exc, or an error it was raised from (torch wraps write errors), is ENOSPC/EDQUOT;
    DCP's CheckpointException counts when any rank's failure it gathered is."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        failures = getattr(exc, "failures", None)  # {rank: (exception, traceback)}
        if isinstance(failures, dict) and _depth < 2:
            for failure in failures.values():
                if is_disk_full(failure[0] if isinstance(failure, tuple) and failure else failure, _depth + 1):
                    return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def no_room_left(path: Path) -> bool:
    """Whether path's filesystem has less room left than any write needs (SLACK_BYTES)."""
    free = free_bytes(path)
    return free is not None and free < SLACK_BYTES


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on path's filesystem (None if unknown)."""
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding path."""
    path = _existing(path).resolve()
    while not os.path.ismount(path) and path.parent != path:
        path = path.parent
    return path


def describe(path: Path, needed: int | None = None) -> str:
    """'filesystem /mnt (holding PATH): 12.0 KiB free, needs about 4.6 MiB'."""
    free = free_bytes(path)
    text = f"filesystem {mount_point(path)} (holding {path}): {human_bytes(free)} free"
    return text + (f", needs about {human_bytes(needed)}" if needed is not None else "")


def disk_full(what: str, path: Path, needed: int | None = None) -> DiskFullError:
    """The DiskFullError for failing to write `what` under path."""
    return DiskFullError(f"disk full: no room for {what}; {describe(path, needed)}", path, free_bytes(path), needed)


def disk_usage(path: Path) -> int:
    """Bytes a file or folder occupies on disk (what deleting it gives back)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    total = st.st_blocks * 512
    if os.path.isdir(path) and not os.path.islink(path):
        for child in os.scandir(path):
            total += disk_usage(Path(child.path))
    return total


TEMP_PREFIXES = (".tmp-step-", ".trash-step-")


def clean_temporaries(root: Path) -> list[Path]:
    """Remove folders left by a checkpoint writer that died mid-save (never checkpoints)."""
    try:
        stale = [p for p in Path(root).iterdir() if p.name.startswith(TEMP_PREFIXES)]
    except OSError:
        return []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def ensure_reserve(path: Path, size: int = RESERVE_BYTES) -> bool:
    """Allocate the reserve file at path (really allocated, not sparse); False if no room."""
    try:
        if os.path.getsize(path) >= size:
            return True
    except OSError:
        pass
    try:
        fd = door.open_own(path, os.O_WRONLY)   # never through a link nor into a FIFO put there
    except OSError:
        return False
    try:
        allocate(fd, size)
        return True
    except OSError:
        os.close(fd)
        fd = -1
        Path(path).unlink(missing_ok=True)  # a partial reserve only confuses
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def allocate(fd: int, size: int) -> None:
    """Give the first `size` bytes of an open file real blocks (not a sparse hole); OSError if no room."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.pwrite(fd, b"\0" * size, 0)  # a filesystem without fallocate
        os.fsync(fd)


@dataclass
class Room:
    """Whether the next checkpoint fits: free bytes, bytes it needs, what to delete first."""

    free: int | None
    needed: int | None
    prune_first: list[Path] = field(default_factory=list)
    fits: bool = True
    kept: int = 0  # older checkpoints that stay beside the new one


def plan_room(root: Path, step: int | None, keep_last: int, extra: int = 0) -> Room:
    """Whether checkpoint `step` (None: one after all of them) fits, judged by the newest one's size.

    If not, prune_first lists what retention would delete after that save anyway, less the newest
    intact checkpoint (every byte verified, as the engine picks: kept until the new one is on
    disk); `extra`: bytes needed besides."""
    # the listing is loaded only when room is planned: a script's `import mt` needs space.py, not this
    from mt.contract.checkpoints import best, folders, intact

    older = [p for s, p in folders(root) if step is None or s < step]
    last = next((b for b in map(checkpoint_bytes, older) if b is not None), None)
    free = free_bytes(root)
    if last is None or free is None:
        return Room(free, None)  # the first checkpoint: nothing to judge it by
    needed = last + SLACK_BYTES + extra
    if free >= needed:
        return Room(free, needed)
    keep = next((p for p in older if intact(p)), None)
    kept = {keep} | {b.path for b in best(root)}  # the best ones keep_best keeps are never retention's
    doomed = [p for p in older[keep_last - 1:] if p not in kept]
    gained = sum(disk_usage(p) for p in doomed)
    return Room(free, needed, doomed, free + gained >= needed, len(older) - len(doomed))


def checkpoint_bytes(path: Path) -> int | None:
    """A checkpoint's size: what its verified manifest lists (None when it is not intact)."""
    from mt.contract.checkpoints import listed_bytes

    return listed_bytes(path)
