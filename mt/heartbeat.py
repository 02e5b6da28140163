"""heartbeat/rank<N>: each rank's last step, time and phase, rewritten in place every step."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


class Heartbeat:
    """Rewrites heartbeat/rank<N> each optimizer step, so a stuck rank is visible from outside.

    One pwrite of a fixed-width record into an open file: no temporary file, no rename, so the
    per-step cost stays in the microseconds. Readers parse JSON and ignore the padding.
    """

    WIDTH = 160

    def __init__(self, path: Path, rank: int, attempt: int) -> None:
        self.path, self.rank, self.attempt = path, rank, attempt
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)

    def beat(self, step: int, phase: str = "train") -> None:
        """`phase` says what the rank does next (train, eval, checkpoint), so a long pause is explained."""
        record = json.dumps({"step": step, "t": time.time(), "pid": os.getpid(), "rank": self.rank, "attempt": self.attempt, "phase": phase})
        os.pwrite(self._fd, record.ljust(self.WIDTH).encode() + b"\n", 0)
