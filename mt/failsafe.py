"""mt's own writes in a user's process: one that fails is said once on stderr, never raised.

A full disk or a read-only folder degrades monitoring; it must not end the training it watches
(docs/library.md, "When mt cannot write").
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


@dataclass
class WriteFailures:
    """The writes of mt's that failed in this process; the first one is said on stderr."""

    count: int = 0
    first: str = ""

    def note(self, where: Path | None, e: OSError) -> None:
        self.count += 1
        if self.count > 1:
            return
        from mt.contract.space import describe, is_disk_full
        target = e.filename or where
        self.first = f"{Path(target).absolute()}: {e.strerror or e}" if target else str(e.strerror or e)
        room = f" ({describe(Path(target))})" if target and is_disk_full(e) else ""
        try:
            print(f"mt: cannot write {self.first}{room}; monitoring degrades, training goes on "
                  f"(mt's later write failures are not shown)", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr itself on the full disk, or closed
            pass

    @contextmanager
    def guard(self, where: Path | None) -> Iterator[None]:
        """Writes of mt's inside it: an OSError is noted, not raised."""
        try:
            yield
        except OSError as e:
            self.note(where, e)

    def summary(self) -> str:
        """For the run's end: what was not recorded ('' when nothing failed)."""
        return f"; mt could not write {self.count} time(s), first {self.first}" if self.count else ""
