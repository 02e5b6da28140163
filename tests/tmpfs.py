"""A small tmpfs for disk-full tests: mounted for the test, always unmounted after (needs root)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    """Mount a tmpfs of `size` (e.g. "7m") on a fresh folder; skips the test where mounting is not allowed.

    The folder is not under tmp_path: pytest sessions running beside this one prune old
    basetemp folders, and that would delete the files of a live run on the mount."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    path = Path(tempfile.mkdtemp(prefix="mt-tmpfs-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        path.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        # lazy: a straggling process holding a file must not leave the mount behind
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
        try:
            path.rmdir()
        except OSError:
            pass


def resize(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True, capture_output=True)


def fill(path: Path, name: str = "filler") -> Path:
    """Write a file under path until the filesystem is full; returns it (delete it to free the space)."""
    filler = path / name
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\1" * 65536)
                f.flush()
        except OSError:
            pass
    try:  # the last partial block may still fit in 4 KiB pieces
        with open(path / f"{name}-tail", "wb") as f:
            while True:
                f.write(b"\1" * 4096)
                f.flush()
    except OSError:
        pass
    return filler


def read_only(path: Path) -> None:
    """Remount the tmpfs read-only: a folder chmod'ed 0555 does not stop root."""
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)
