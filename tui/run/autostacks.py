"""The supervisor's captures for its incidents: when a `hang` or `dataloader_stall` opens, every
rank's stacks in a background thread (one at a time, one per opened incident), then the
verdict as an `update` of the same incident (docs/run-directory.md, incidents.jsonl)."""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tui.diagnose.stacks import kind_of
from tui.run.stacks import Capture, capture

CAPTURE_CODES = ("hang", "dataloader_stall")
ODD_FRAMES = 6  # the odd rank's innermost user frames kept in the incident: what fits a panel at 80x24


@dataclass(frozen=True)
class Done:
    """A finished capture for an incident: its result, or why there is none."""

    code: str
    capture: Capture | None
    error: str = ""


def evidence_of(cap: Capture, run_dir: Path) -> dict[str, Any]:
    """What the incident gains: the folder (relative to the run), the verdict line, ranks per place."""
    ev: dict[str, Any] = {
        "stacks": os.path.relpath(cap.folder, run_dir), "verdict": cap.verdict.line,
        "groups": [{"ranks": list(g.ranks), "func": g.place.frame.func, "where": g.place.frame.where(),
                    "waits_in": g.place.waits_in} for g in cap.verdict.groups],
        "capture_s": round(cap.seconds, 3),
    }
    frames = odd_frames(cap)
    if frames:
        ev["frames"] = frames
    if cap.workers:
        ev["workers"] = [w.line() for w in cap.workers]
    return ev


def odd_frames(cap: Capture) -> list[str]:
    """The odd group's first rank: its main thread's innermost user frames (else its innermost ones), `func (file:line)`."""
    if not cap.verdict.groups:
        return []
    rank = cap.verdict.groups[0].ranks[0]
    main = next((s.main_thread() for s in cap.stacks if s.rank == rank), None)
    if main is None:
        return []
    own = [f for f in main.frames if kind_of(f.file) == "user"] or list(main.frames)
    return [f"rank {rank}: {f.func} ({f.where()})" if i == 0 else f"{f.func} ({f.where()})"
            for i, f in enumerate(own[:ODD_FRAMES])]


def detail_of(cap: Capture) -> str:
    """The sentence added to the incident's detail: the verdict, then the workers' places."""
    return "; ".join([f"stacks: {cap.verdict.line}", *(w.line() for w in cap.workers)])


class IncidentCaptures:
    """Starts captures off the supervisor's thread and hands back the finished ones (`take`)."""

    def __init__(self, run_dir: Path, log: logging.Logger, wait_s: float = 2.0, node: str | None = None) -> None:
        self.run_dir, self.log, self.wait_s, self.node = Path(run_dir), log, wait_s, node
        self._queue: list[str] = []
        self._done: list[Done] = []
        self._lock = threading.Lock()   # _done is filled by the capture thread, emptied by the tick
        self._thread: threading.Thread | None = None

    def opened(self, code: str) -> None:
        """An incident opened: capture for it (now, or after the capture that runs)."""
        if code in CAPTURE_CODES:
            self._queue.append(code)
            self._next()

    def _next(self) -> None:
        if self._queue and (self._thread is None or not self._thread.is_alive()):
            code = self._queue.pop(0)
            self._thread = threading.Thread(target=self._run, args=(code,), name=f"mt-stacks-{code}", daemon=True)
            self._thread.start()

    def _run(self, code: str) -> None:
        try:
            done = Done(code, capture(self.run_dir, why=code, wait_s=self.wait_s, workers=code == "dataloader_stall",
                                      node=self.node))
        except Exception as e:  # never the end of the run: the incident just goes without stacks
            self.log.exception("stacks capture for %s failed", code)
            done = Done(code, None, str(e))
        with self._lock:
            self._done.append(done)

    def take(self) -> list[Done]:
        """The captures finished since the last call; starts a queued one."""
        with self._lock:
            done, self._done = self._done, []
        self._next()
        return done
