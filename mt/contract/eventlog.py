"""Writing events.jsonl: one whole line per write, and its binary index beside it."""
from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

from mt.contract import door
from mt.contract.events import dumps, make_event


class EventWriter:
    """Appends events to events.jsonl, one whole line per write so readers never see a torn one,
    and a record per line to its binary index (`mt.contract.eventindex`)."""

    def __init__(self, path: Path, index: bool = True) -> None:
        from mt.contract.eventindex import open_index  # it builds on this module
        self.path = Path(path)
        # RDWR: to look at the last byte; never through a link, never blocking on a FIFO put there
        self._fd = door.open_own(self.path, os.O_RDWR | os.O_APPEND)
        _end_torn_line(self._fd)
        self._torn = False  # a rolled-back write's fragment could not be removed
        self._index = open_index(self.path) if index else None
        self._lock = threading.Lock()  # a script's heartbeat thread may write too: line and index stay paired
        self.last: dict[str, dict[str, Any]] = {}  # the newest event of each kind written (the checkpointer reads the eval's)

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = make_event(kind, **fields)
        line = (dumps(event) + "\n").encode()
        with self._lock:
            end = self._append(line)
            if self._index is not None:
                self._index.add(event, end)
        self.last[kind] = event
        return event

    def emit_lines(self, lines: list[bytes], rows: list[tuple[float, ...] | None]) -> None:
        """Events already encoded, one whole line each, in one write; `rows` are their index
        records' values without the end offset (None: the index parses that line)."""
        if not lines:
            return
        with self._lock:
            end = self._append(b"".join(lines))
            if self._index is not None:
                ends = []
                for line in reversed(lines):
                    ends.append(end)
                    end -= len(line)
                self._index.add_lines(lines, rows, ends[::-1])

    def _append(self, data: bytes) -> int:
        """Append whole lines or none (OSError): a full disk takes part of a write, and the next line
        would finish that fragment. Returns the end offset (with O_APPEND, just past our bytes)."""
        if self._torn:
            data = b"\n" + data
        n = os.write(self._fd, data)
        end = os.lseek(self._fd, 0, os.SEEK_CUR)
        if n == len(data):
            self._torn = False
            return end
        try:
            if os.fstat(self._fd).st_size == end:  # the fragment is still the last thing in the file
                os.ftruncate(self._fd, end - n)
            self._torn = False
        except OSError:
            self._torn = True  # the next write ends it first
        raise OSError(errno.ENOSPC, f"only {n} of {len(data)} bytes fit (rolled back): {os.strerror(errno.ENOSPC)}",
                      str(self.path))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._index is not None:
            self._index.close()


def _end_torn_line(fd: int) -> None:
    """A writer killed mid-line left a fragment: end it, so it stays one bad line of its own."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


class NullEventWriter:
    """What ranks other than 0 get: the same interface, doing nothing."""

    def __init__(self) -> None:
        self.last: dict[str, dict[str, Any]] = {}  # nothing is written: nothing is remembered

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        return make_event(kind, **fields)

    def close(self) -> None:
        pass
