"""Reading and writing the run directory's JSON files: growing JSONL tails, atomic small files."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from mt.events import dumps, parse_line


def write_json_atomic(path: Path, obj: Any, mode: int = 0o600) -> None:
    """Write JSON to a temporary file in the same folder, then rename it into place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dumps(obj))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any | None:
    """A small JSON file (status, heartbeat, control), or None if missing or unreadable."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class JsonlTail:
    """Reads only the new complete lines of a growing JSONL file.

    Keeps a half-written last line back until it is finished, skips and counts lines that are
    not JSON objects, and starts over when the file is truncated or replaced.
    """

    def __init__(self, path: Path | str, offset: int = 0, ino: int | None = None) -> None:
        """Start at `offset` (a line boundary) of the file with inode `ino`, e.g. after a bulk read."""
        self.path = Path(path)
        self.offset = offset
        self.bad_lines = 0
        self.resets = 0
        self._partial = b""
        self._ino = ino

    @classmethod
    def near_end(cls, path: Path | str, max_bytes: int) -> "JsonlTail":
        """A tail that skips all but (about) the last max_bytes: for files where only recent lines matter."""
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                start = max(0, st.st_size - max_bytes)
                if start:
                    f.seek(start - 1)
                    start += len(f.readline()) - 1     # to the next line boundary
                return cls(path, start, st.st_ino)
        except OSError:
            return cls(path)

    def read_new(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        return list(self.iter_new(max_bytes))

    def iter_new(self, max_bytes: int | None = None) -> Iterator[dict[str, Any]]:
        """Yield each new complete, valid line as a dict (at most max_bytes read per call)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if self._ino is not None and (st.st_ino != self._ino or st.st_size < self.offset):
            self.offset, self._partial = 0, b""
            self.resets += 1
        self._ino = st.st_ino
        if st.st_size == self.offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(max_bytes) if max_bytes else f.read()
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            obj = parse_line(line)
            if obj is None:
                self.bad_lines += 1
            else:
                yield obj


def read_events(path: Path | str) -> list[dict[str, Any]]:
    """Every valid line of a JSONL file (the last line counts when it is complete JSON)."""
    tail = JsonlTail(path)
    events = tail.read_new()
    last = parse_line(tail._partial) if tail._partial.strip() else None
    if last is not None:
        events.append(last)
    return events
