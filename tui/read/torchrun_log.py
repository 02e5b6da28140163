"""torchrun's failure report in its log: which worker failed first, with which exit code and traceback."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from mt.contract import door

_ROOT = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(rank|exitcode|traceback|error_file)\s*:\s*(.*)$")


@dataclass
class Failure:
    """One failed worker as torchrun reported it."""

    rank: int
    exit_code: int | None
    pid: int | None = None
    traceback: str = ""
    node: str | None = None
    """The node it ran on, in a job of several nodes (its supervisor's report)."""


def torchrun_failures(text: str) -> list[Failure]:
    """The last ChildFailedError report in torchrun's log: the root cause first, then the rest."""
    at = text.rfind(_ROOT)
    if at < 0:
        return []
    start = text.rfind("Failures:", 0, at)
    blocks = text[start if start >= 0 else at:]
    end = blocks.find("=" * 20, blocks.find(_ROOT) if _ROOT in blocks else 0)
    body = blocks[:end] if end > 0 else blocks
    others, root = body.split(_ROOT, 1) if _ROOT in body else ("", body)
    out = _parse_blocks(root) + _parse_blocks(others)
    return out


def _parse_blocks(text: str) -> list[Failure]:
    found: list[Failure] = []
    cur: Failure | None = None
    for line in text.splitlines():
        m = _FIELD.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2).strip()
        if key == "rank":
            r = re.match(r"(\d+)", value)
            cur = Failure(int(r.group(1)) if r else -1, None)
            found.append(cur)
        elif cur is not None and key == "exitcode":
            code = re.match(r"(-?\d+)(?:\s*\(pid:\s*(\d+)\))?", value)
            if code:
                cur.exit_code = int(code.group(1))
                cur.pid = int(code.group(2)) if code.group(2) else None
        elif cur is not None and key == "traceback":
            cur.traceback = value
    return found


FAILURE_TAIL_BYTES = 4 << 20
"""How much of the log's end read_failures reads: torchrun's report is its last few KiB."""


def read_failures(log_path: Path, offset: int) -> list[Failure]:
    """torchrun's ChildFailedError report in its log after `offset` (the root cause first); [] without one."""
    try:
        with door.open_file(log_path) as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - FAILURE_TAIL_BYTES))   # the report ends the log
            text = f.read(FAILURE_TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    return torchrun_failures(text)


def worker_exit_code(log_path: Path, offset: int) -> int | None:
    """The first failed worker's exit code, from torchrun's ChildFailedError report after `offset`."""
    failures = read_failures(log_path, offset)
    return failures[0].exit_code if failures else None
