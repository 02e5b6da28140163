"""The one door into the run directory: every read of a run-directory file opens here.

What it refuses, before a byte is read: anything that is not a regular file (a FIFO, a socket, a
device such as /dev/zero, a folder), a symbolic link unless the caller says the layout allows one,
and a whole-file read of more than the caller's stated bound. It never blocks (O_NONBLOCK: a FIFO
put in a run directory cannot hang a reader) and never unpickles. tests/test_door.py walks the
source and fails on any other open or read of a file in mt/, tui/ or engine/.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO, Iterator

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_OWN = os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW

SMALL_JSON = 1 << 20
"""The default bound of a small JSON file (status, config, a request, a verdict): 1 MiB."""


class Refused(OSError):
    """A path the door will not read: not a regular file, a link where none belongs, or over its bound."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _check(fd: int, path: str | os.PathLike[str]) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Refused(f"{path}: {_kind(st.st_mode)}, not a regular file")
    return st


def open_fd(path: str | os.PathLike[str], *, follow: bool = False) -> tuple[int, os.stat_result]:
    """(fd, stat) of a regular file opened read-only without blocking; a link is refused unless follow.

    FileNotFoundError passes through as itself; everything else the door refuses is Refused.
    """
    try:
        fd = os.open(path, _READ | (0 if follow else os.O_NOFOLLOW))
    except FileNotFoundError:
        raise
    except OSError as e:
        if not follow and os.path.islink(path):
            raise Refused(f"{path}: a symbolic link, not a file of the run directory") from None
        raise Refused(f"{path}: {e.strerror or type(e).__name__}") from None
    return fd, _check(fd, path)


@contextlib.contextmanager
def open_file(path: str | os.PathLike[str], *, follow: bool = False) -> Iterator[BinaryIO]:
    """A binary file object for a reader that reads in bounded chunks (tails, indexes); the door's checks first."""
    fd, _ = open_fd(path, follow=follow)
    with os.fdopen(fd, "rb") as f:
        yield f


def read_bytes(path: str | os.PathLike[str], max_bytes: int, *, follow: bool = False) -> bytes:
    """The whole file, refused (Refused) if it holds more than max_bytes."""
    fd, st = open_fd(path, follow=follow)
    try:
        if st.st_size > max_bytes:
            raise Refused(f"{path}: {st.st_size} bytes, more than the {max_bytes} bytes such a file may hold")
        data = _read_up_to(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:   # it grew between fstat and read
        raise Refused(f"{path}: more than the {max_bytes} bytes such a file may hold")
    return data


def read_head(path: str | os.PathLike[str], max_bytes: int, *, follow: bool = False) -> bytes:
    """At most the first max_bytes of the file, whatever its size."""
    fd, _ = open_fd(path, follow=follow)
    try:
        return _read_up_to(fd, max_bytes)
    finally:
        os.close(fd)


def read_tail(path: str | os.PathLike[str], max_bytes: int, *, follow: bool = False) -> bytes:
    """At most the last max_bytes of the file (a log's end), whatever its size."""
    fd, st = open_fd(path, follow=follow)
    try:
        if st.st_size > max_bytes:
            os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
        return _read_up_to(fd, max_bytes)
    finally:
        os.close(fd)


def _read_up_to(fd: int, n: int) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_text(path: str | os.PathLike[str], max_bytes: int, *, follow: bool = False) -> str:
    """The whole file as UTF-8 text (bad bytes replaced), refused over max_bytes."""
    return read_bytes(path, max_bytes, follow=follow).decode("utf-8", errors="replace")


def read_json(path: str | os.PathLike[str], max_bytes: int = SMALL_JSON, *, follow: bool = False) -> Any | None:
    """A small JSON file's value, or None if it is missing, refused, or not JSON."""
    try:
        return json.loads(read_bytes(path, max_bytes, follow=follow))
    except (OSError, ValueError, RecursionError):   # a bad UTF-8 byte is a ValueError too
        return None


def read_json_why(path: str | os.PathLike[str], max_bytes: int = SMALL_JSON) -> tuple[Any, str | None]:
    """(value, None), or (None, why not) in words: for readers that report what they skipped."""
    try:
        data = read_bytes(path, max_bytes)
    except FileNotFoundError:
        return None, "missing"
    except OSError as e:
        return None, str(e).removeprefix(f"{path}: ")
    try:
        return json.loads(data), None
    except (ValueError, RecursionError) as e:
        return None, f"not valid JSON ({str(e)[:120]})"


def is_regular(path: str | os.PathLike[str]) -> bool:
    """True for a regular file that is not a link (lstat: nothing is opened)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def folder_names(path: str | os.PathLike[str], *, folders_only: bool = False) -> list[str]:
    """The names in a folder that is not a link (listed through the folder opened here, so a folder
    swapped for a link after the check is not followed); [] if it is missing or not a folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        with os.scandir(fd) as it:
            return [e.name for e in it if not folders_only or e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    finally:
        os.close(fd)


def open_own(path: str | os.PathLike[str], flags: int, mode: int = 0o600) -> int:
    """An fd to write one of mt's own files (created if missing) with `flags` (O_WRONLY, O_RDWR,
    O_APPEND, ...): never through a link, never blocking on a FIFO, Refused for anything not a regular file."""
    try:
        fd = os.open(path, flags | _OWN, mode)
    except FileNotFoundError:
        raise
    except OSError as e:    # a FIFO without a reader is ENXIO, a link ELOOP: say which
        try:
            what = "a symbolic link" if os.path.islink(path) else _kind(os.lstat(path).st_mode)
        except OSError:
            raise e from None
        raise Refused(f"{path}: {what}, not a regular file") from None
    _check(fd, path)
    return fd


def open_append(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """A write-only, appending fd of a regular file (created if missing); never through a link, never blocking."""
    return open_own(path, os.O_WRONLY | os.O_APPEND, mode)


def size_of(path: Path | str) -> int:
    """The size of a regular file (0 if missing or not one)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0
