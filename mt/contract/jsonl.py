"""Reading and writing the run directory's JSON files: growing JSONL tails, atomic small files."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from mt.contract import door
from mt.contract.events import dumps, parse_line


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


def read_json(path: Path, max_bytes: int = door.SMALL_JSON) -> Any | None:
    """A small JSON file (status, config, control), or None if missing, unreadable, refused by the
    door (a FIFO, a device, a link, over max_bytes) or not JSON."""
    return door.read_json(path, max_bytes)


MAX_LINE_BYTES = 1 << 20   # a longer line is skipped and counted, never held whole in memory
_READ_BYTES = 4 << 20


class LineBuffer:
    """Bytes in, complete lines out: the unfinished last line is kept back (`partial`) until its newline
    comes. The one way a tail of a growing file splits lines (JsonlTail, the log panel's LogTail)."""

    def __init__(self) -> None:
        self.partial = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The lines `data` completes, without their newlines."""
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return lines


class JsonlTail:
    """Reads only the new complete lines of a growing JSONL file.

    Keeps a half-written last line back until it is finished, skips and counts lines that are
    not JSON objects (or longer than MAX_LINE_BYTES), and starts over when the file is
    truncated or replaced.
    """

    def __init__(self, path: Path | str, offset: int = 0, ino: int | None = None) -> None:
        """Start at `offset` (a line boundary) of the file with inode `ino`, e.g. after a bulk read."""
        self.path = Path(path)
        self.offset = offset
        self.bad_lines = 0
        self.last_bad = ""      # why the newest bad line was skipped
        self.resets = 0
        self._lines = LineBuffer()
        self._skipping = False  # inside an over-long line: drop bytes up to its newline
        self._ino = ino

    @classmethod
    def near_end(cls, path: Path | str, max_bytes: int) -> "JsonlTail":
        """A tail that skips all but (about) the last max_bytes: for files where only recent lines matter."""
        try:
            with door.open_file(path) as f:
                st = os.fstat(f.fileno())
                start = max(0, st.st_size - max_bytes)
                if start:
                    f.seek(start - 1)
                    nl = next_newline(f, st.st_size)    # to the next line boundary
                    start = st.st_size if nl < 0 else nl + 1
                return cls(path, start, st.st_ino)
        except OSError:
            return cls(path)

    @property
    def line_offset(self) -> int:
        """Where the next unread line starts: a tail made with it later misses and repeats nothing."""
        return self.offset - len(self._lines.partial) if not self._skipping else self.offset

    @property
    def ino(self) -> int | None:
        return self._ino

    def reject(self, reason: str) -> None:
        """Count one line no reader may use."""
        self.bad_lines += 1
        self.last_bad = reason

    def read_new(self, max_bytes: int | None = None) -> list[Any]:
        return list(self.iter_new(max_bytes))

    def iter_new(self, max_bytes: int | None = None) -> Iterator[Any]:
        """Yield each new complete line that is a JSON object, as a dict."""
        for line in self.iter_lines(max_bytes):
            obj = parse_line(line)
            if obj is None:
                self.reject("not a JSON object")
            else:
                yield obj

    def iter_lines(self, max_bytes: int | None = None) -> Iterator[bytes]:
        """Yield each new complete, non-blank line (at most max_bytes read per call)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if self._ino is not None and (st.st_ino != self._ino or st.st_size < self.offset):
            self.offset, self._lines, self._skipping = 0, LineBuffer(), False
            self.resets += 1
        self._ino = st.st_ino
        budget = st.st_size - self.offset if max_bytes is None else min(max_bytes, st.st_size - self.offset)
        if budget <= 0:
            return
        try:
            fd, _ = door.open_fd(self.path)
        except OSError:     # gone since the stat, or refused (a FIFO, a device, a link): nothing new
            return
        try:
            while budget > 0:
                data = os.pread(fd, min(_READ_BYTES, budget), self.offset)
                if not data:
                    break
                budget -= len(data)
                self.offset += len(data)
                yield from self._split(data)
        finally:
            os.close(fd)

    def _split(self, data: bytes) -> Iterator[bytes]:
        if self._skipping:
            cut = data.find(b"\n")
            if cut < 0:
                return
            data, self._skipping = data[cut + 1:], False
        lines = self._lines.feed(data)
        if len(self._lines.partial) > MAX_LINE_BYTES:
            self._lines.partial, self._skipping = b"", True
            self.reject(f"a line over {MAX_LINE_BYTES} bytes")
        for line in lines:
            if len(line) > MAX_LINE_BYTES:
                self.reject(f"a line over {MAX_LINE_BYTES} bytes")
            elif line.strip():
                yield line

    def iter_all_lines(self) -> Iterator[bytes]:
        """Every line of the file, the last one too when it lacks only its newline."""
        yield from self.iter_lines()
        if self._lines.partial.strip():
            yield self._lines.partial


def next_newline(f: BinaryIO, end: int) -> int:
    """The offset of the next newline before `end` from f's position, or -1 (read in chunks)."""
    pos = f.tell()
    while pos < end:
        data = f.read(min(_READ_BYTES, end - pos))
        if not data:
            break
        i = data.find(b"\n")
        if i >= 0:
            return pos + i
        pos += len(data)
    return -1


def read_events(path: Path | str) -> list[dict[str, Any]]:
    """Every line of a JSONL file that is a JSON object (the last line counts when it is complete)."""
    return [obj for obj in map(parse_line, JsonlTail(path).iter_all_lines()) if obj is not None]
