"""Follow one run directory incrementally into a `RunState`; `load_run_state` reads it once."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mt.contract.paths import RunPaths
from mt.contract.records import Record, RecordTail, Step, incident_tail
from mt.contract.status import read_status
from tui.read import BULK_MIN_BYTES as BULK_MIN_BYTES  # re-exported: the follower's threshold (tests patch it here)
from tui.read.replay import Causes
from tui.state.runseries import RunSeries
from tui.state.runstate import REPLAY_CODES, BulkResult, RunState, add_incident, apply_status, new_state, reduce_event, reduce_step

CAUSES_EVERY_S = 1.0
"""How often a follower looks for mt replay's reports (a folder listing and a stat each)."""


@dataclass
class PollResult:
    """What one `RunFollower.poll()` found."""

    changed: bool = False
    new_events: list[Record] = field(default_factory=list)  # non-step records, in order
    new_steps: int = 0


class RunFollower:
    """Follows one run directory incrementally: each poll reads only newly appended bytes."""

    def __init__(self, run_dir: Path, keep_series: bool = True) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.state = new_state(self.paths.root)
        self.series = RunSeries() if keep_series else None
        self.opened = False    # the first read of events.jsonl happened
        self.events = RecordTail(self.paths.events)
        self.incidents = incident_tail(self.paths.incidents)
        self._status_mtime: float | None = None
        self.causes = Causes(self.paths.root)
        self._causes_due = 0.0

    def poll(self, max_bytes: int | None = None) -> PollResult:
        """Read what was appended since the last poll (at most max_bytes of events)."""
        res = PollResult()
        if not self.opened:
            self.opened = True
            if self.is_big():
                self.adopt(self.bulk())
                res.changed = True
        resets = self.events.resets
        for ev in self.events.iter_new(max_bytes):
            if self.events.resets != resets:
                break
            self._fold(ev, res)
        if self.events.resets != resets:
            # events.jsonl was truncated or replaced: rebuild from scratch
            self._restart()
            res.changed = True
            for ev in self.events.iter_new(max_bytes):
                self._fold(ev, res)
        self.state.bad_lines = self.events.bad_lines + self.incidents.bad_lines
        self.state.bad_reason = self.incidents.last_bad or self.events.last_bad
        for rec in self.incidents.iter_new():
            add_incident(self.state, rec, source="supervisor")
            res.changed = True
        res.changed |= self._poll_status()
        st = self.state
        res.changed |= self._poll_causes()
        if st.script is not None and not st.n_steps and st.attempt_t is None and st.mt_init_attempt != st.attempt:
            from tui.read.nodes import called_mt_init  # a script before its first step only: a few small reads
            if called_mt_init(self.paths, st.attempt):
                st.mt_init_attempt, res.changed = st.attempt, True
        return res

    def _poll_causes(self) -> bool:
        """mt replay's causes, read once a NaN or spike incident is there (at most once a second)."""
        now = time.monotonic()
        if now < self._causes_due or not any(i.code in REPLAY_CODES for i in self.state.incidents):
            return False
        self._causes_due = now + CAUSES_EVERY_S
        causes = self.causes.poll()
        changed, self.state.causes = causes != self.state.causes, causes
        return changed

    def is_big(self) -> bool:
        """Large enough for the bulk read (the engine's index, else the column scan) to beat line-by-line JSON."""
        try:
            return self.paths.events.stat().st_size >= BULK_MIN_BYTES
        except OSError:
            return False

    def bulk(self) -> Any:
        """Read events.jsonl as it is now from the engine's index and the column scanner (no shared state touched)."""
        from tui.read.bulk import bulk_read  # numpy + regex machinery, only for big files
        return bulk_read(self.paths.root, keep_series=self.series is not None)

    def has_fast_start(self) -> bool:
        """A bulk read would start from the engine's index covering (nearly) all of events.jsonl."""
        from tui.read.bulk import has_fast_start
        return has_fast_start(self.paths, BULK_MIN_BYTES)

    def newest_first(self, index: bool = True, tail: bool = True, keep_series: bool = False) -> BulkResult | None:
        """How every reader opens a big run: its newest state before its history, or None (small run).

        From the engine's index tail (a few ms, no numpy) when `index`, else from events.jsonl's
        tail when `tail` unless the index makes the full read fast anyway.
        Best loss is then partial; `adopt` it, and a bulk read (or nothing) brings the history.
        """
        if not self.is_big():
            return None
        quick = None
        if index:
            from tui.read.index_tail import quick_read_index
            quick = quick_read_index(self.paths.root)
        if quick is None and tail and not self.has_fast_start():
            from tui.read.bulk import quick_read
            quick = quick_read(self.paths.root, keep_series=keep_series)
        return quick

    def adopt(self, bulk: Any) -> None:
        """Take a bulk read's state and history, and follow on from the byte it ended at."""
        self.state = bulk.state
        self._causes_due = 0.0  # a new state: its causes are read at the next poll
        if self.series is not None and bulk.series is not None:
            self.series.replace(bulk.series)
        self.events = RecordTail(self.paths.events, bulk.end, bulk.ino)
        self.events.bad_lines = bulk.state.bad_lines
        self.incidents = incident_tail(self.paths.incidents)
        self._status_mtime = None
        self.opened = True

    def _restart(self) -> None:
        tail = self.events
        self.state = new_state(self.paths.root)
        self._causes_due = 0.0
        if self.series is not None:
            for s in (*self.series.all().values(), *self.series.extra.values()):
                s.clear()
        self.incidents = incident_tail(self.paths.incidents)
        self._status_mtime = None
        self.events = RecordTail(self.paths.events)
        self.events.resets = tail.resets

    def _fold(self, ev: Record, res: PollResult) -> None:
        res.changed = True
        if isinstance(ev, Step):
            res.new_steps += 1
            reduce_step(self.state, ev)
            if self.series is not None:
                self.series.add_step(ev)
            return
        if self.series is not None:
            self.series.add_event(ev)
        reduce_event(self.state, ev)
        res.new_events.append(ev)

    def _poll_status(self) -> bool:
        try:
            mtime = self.paths.status.stat().st_mtime_ns
        except OSError:
            return False
        if mtime == self._status_mtime:
            return False
        self._status_mtime = mtime
        return apply_status(self.state, read_status(self.paths.root))


def load_run_state(run_dir: Path, exact_best: bool = True) -> RunState:
    """The current state of a run, read once (no plot history kept); fast on huge files.

    A big events.jsonl is read from the engine's index when it covers it, else tail-first:
    every non-step event plus the newest steps (best loss then says it is partial). Without `exact_best` (`mt ls`), a big run with an index is read from the
    index's tail only: a few ms and no numpy, best loss partial.
    """
    follower = RunFollower(Path(run_dir), keep_series=False)
    quick = follower.newest_first(index=not exact_best)
    if quick is not None:
        follower.adopt(quick)
    follower.poll()
    return follower.state
