"""One supervisor per run directory: an flock on `supervisor.lock`, released by the OS when its holder dies.

`mt launch` / `mt resume` take the lock before they check or write anything and hand the
locked file to the supervisor they start (an inherited descriptor shares the lock), so
there is no moment when a second resume could slip in.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from mt.contract.paths import RunPaths


class RunBusy(RuntimeError):
    """Someone else holds the run; str() names the holder."""


def acquire(run_dir: Path, holder: str, node: str | None = None) -> int:
    """The locked descriptor of run_dir's lock file (with `node`, that node's in a job's shared run
    directory: one supervisor per node), or RunBusy naming who holds it."""
    path = RunPaths(Path(run_dir), node).supervisor_lock
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = _read(fd) or "another process"
        os.close(fd)
        raise RunBusy(f"{run_dir}: the run is held by {who}; only one supervisor may run it") from None
    except OSError:
        os.close(fd)
        raise
    note_holder(fd, holder)
    return fd


def adopt(run_dir: Path, fd: int, holder: str) -> None:
    """Take over a descriptor handed down by the process that locked the run (checked, not trusted)."""
    try:
        if os.path.samestat(os.fstat(fd), os.stat(RunPaths(Path(run_dir)).supervisor_lock)):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # already ours: succeeds at once
            note_holder(fd, holder)
            return
    except OSError as e:
        raise RunBusy(f"{run_dir}: the lock handed down (descriptor {fd}) is not held: {e}") from None
    raise RunBusy(f"{run_dir}: descriptor {fd} is not this run's lock")


def note_holder(fd: int, holder: str) -> None:
    """Say in the lock file who holds it, for the message the next caller gets."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{holder}\n".encode(), 0)


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""


class DirWatch:
    """Notices that a run directory was deleted, or that another folder took its place (new inode)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        st = os.stat(self.run_dir)
        self.identity = (st.st_dev, st.st_ino)

    def lost(self) -> str | None:
        """Why the path is no longer this run's folder, or None while it still is."""
        try:
            st = os.stat(self.run_dir)
        except FileNotFoundError:
            return f"{self.run_dir}: the run directory was deleted"
        except OSError:
            return None  # unreadable for a moment (NFS hiccup): not proof that it is gone
        if (st.st_dev, st.st_ino) != self.identity:
            return f"{self.run_dir}: the run directory was replaced by another folder"
        return None
