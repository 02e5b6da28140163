"""Everything the viewer's file-following worker reads, with no Textual in it.

`Watcher.poll()` reads new bytes of events.jsonl / incidents.jsonl / status.json (via
`RunFollower`), of system.jsonl (latest sample + short history) and of the shown rank log.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mt.contract import door
from mt.contract.heartbeat import read_heartbeats
from mt.contract.jsonl import JsonlTail, LineBuffer
from mt.contract.system import clean_sample
from tui.format.fmt import terminal_line
from tui.read.follower import PollResult, RunFollower
from tui.read.nodes import JobReader, NodeView, node_of_ranks

HISTORY = 60  # samples of GPU utilisation kept for the sparkline (1 per second)
FIRST_PAINT_GRACE_S = 0.15     # measured: the first data frame reaches the terminal ~0.1 s after it is composed
SYSTEM_TAIL_BYTES = 256 * 1024  # a 10-hour 8-GPU system.jsonl is ~70 MB; HISTORY samples fit in far less
NODES_EVERY_S = 1.0   # a job's nodes are read once a second: samples come that often, ages are shown in seconds
NODES_CPU_SHARE = 0.05  # ...or less often, where reading them all would cost more of a core than this,
NODES_MAX_EVERY_S = 10.0  # but at least this often
PARTIAL_MAX = 4096   # an unfinished line kept beyond this: a bar's newest state only (64 KiB of states cost 4 ms a poll)
PENDING_CHARS = 1000      # of an unfinished line, the panel shows the end


@dataclass
class SystemView:
    """The newest system.jsonl sample and a short utilisation history per GPU / rank."""

    sample: dict[str, Any] | None = None
    gpu_util: dict[int, deque] = field(default_factory=dict)
    rank_cpu: dict[int, deque] = field(default_factory=dict)
    samples: int = 0
    anatomy: dict[int, dict[str, float]] = field(default_factory=dict)
    """Each rank's step anatomy from its heartbeat, read with each new sample."""

    def add(self, rec: dict[str, Any]) -> None:
        """Take one sample that `clean_sample` returned."""
        self.sample = rec
        self.samples += 1
        for g in rec["gpus"]:
            self.gpu_util.setdefault(g["index"], deque(maxlen=HISTORY)).append(g["util_pct"])
        for r in rec["ranks"]:
            self.rank_cpu.setdefault(r["rank"], deque(maxlen=HISTORY)).append(r["cpu_pct"])


class LogTail:
    """The last lines of one rank's log, read incrementally; switching rank re-reads the end."""

    def __init__(self, path: Path, keep: int = 200, start_bytes: int = 64 * 1024) -> None:
        self.path = path
        self.lines: deque[str] = deque(maxlen=keep)
        self._offset: int | None = None
        self._lines = LineBuffer()
        self._start_bytes = start_bytes

    def poll(self) -> list[str]:
        """New complete lines since the last poll (the tail of the file on the first call)."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return []
        if self._offset is None or size < self._offset:
            self._offset = max(0, size - self._start_bytes)
            self._lines = LineBuffer()
            skip_first = self._offset > 0  # landed mid-line
        else:
            skip_first = False
        if size == self._offset:
            return []
        try:
            with door.open_file(self.path) as f:
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError:     # gone, or refused by the door (a FIFO, a device, a link)
            return []
        self._offset += len(data)
        parts = self._lines.feed(data)
        held = self._lines.partial
        if len(held) > PARTIAL_MAX and b"\r" in held:
            # a progress bar that never ends its line: only its newest state will be shown
            self._lines.partial = held[held.rindex(b"\r"):]
        if skip_first and parts:
            parts = parts[1:]
        # as a terminal shows them: a bar's `\r` rewrites as its last state, cursor moves dropped
        new = [terminal_line(p.decode("utf-8", "replace")) for p in parts]
        self.lines.extend(new)
        return new

    def pending(self) -> str:
        """The unfinished last line as a terminal shows it now: a running progress bar's state."""
        if not self._lines.partial:
            return ""
        return terminal_line(self._lines.partial.decode("utf-8", "ignore"))[-PENDING_CHARS:]


@dataclass
class WatchUpdate:
    """One poll's worth of news for the UI."""

    run: PollResult
    system_changed: bool = False
    new_log_lines: list[str] = field(default_factory=list)
    log_reset: bool = False
    log_pending: str | None = None   # the log's unfinished last line (a running bar) as it shows now; None: unchanged


class Watcher:
    """Owns every tail of one run directory. `lock` guards state/series against the UI thread."""

    def __init__(self, run_dir: Path) -> None:
        self.follower = RunFollower(Path(run_dir))
        self.system = SystemView()
        self._system_tail = JsonlTail.near_end(self.follower.paths.system, SYSTEM_TAIL_BYTES)
        self.job = JobReader(Path(run_dir))
        self.nodes: list[NodeView] = []   # a job's nodes (nodes/<node>/); [] on one machine
        self._nodes_read = -float("inf")
        self.nodes_every_s = NODES_EVERY_S
        self.lock = threading.RLock()
        self.log_rank = 0
        self._log = LogTail(self.follower.paths.rank_log(0))
        self._log_reset = True
        self._log_pending = ""     # the unfinished last line the UI was last handed
        # the first check waits 2 s: it imports psutil, which the first frame need not wait for
        self._live_checked = time.monotonic()
        self.history_ready = False     # the plots hold the whole file read so far
        self.frame_shown = threading.Event()  # set by the UI once a first frame is on screen
        self._quick_shown = False      # a big run's newest state was adopted before its history
        self._big_read = False         # a big run's whole history was read

    @property
    def paths(self):
        return self.follower.paths

    def set_log_rank(self, rank: int) -> None:
        """Show another rank's log from the next poll on."""
        with self.lock:
            self.log_rank = rank
            self._log = LogTail(self._rank_log(rank))
            self._log_reset = True

    def _rank_log(self, rank: int) -> Path:
        """The rank's log: in a job, under the folder of the node its files are in."""
        node = node_of_ranks(self.nodes).get(rank) if self.nodes else None
        return self.follower.paths.on(node).rank_log(rank)

    @property
    def log_switch_pending(self) -> bool:
        """A rank switch the worker has not read yet."""
        return self._log_reset

    def log_lines(self) -> list[str]:
        with self.lock:
            return list(self._log.lines)

    def ranks(self) -> int:
        """How many rank logs there are to cycle through."""
        ws = self.follower.state.world_size or 0
        try:
            n = len([p for p in self.follower.paths.logs.glob("rank*.log")])
        except OSError:
            n = 0
        return max(ws, n, 1)

    def open_quick(self) -> bool:
        """A big run's newest state from the engine's index, adopted now (a few ms, no numpy) so
        the first frame can show it; True if there was one. The next poll reads the history."""
        f = self.follower
        quick = None if f.opened else f.newest_first(tail=False)
        if quick is None:
            return False
        with self.lock:
            f.adopt(quick)
            f.poll()                # status, incidents and whatever was appended meanwhile
        self._quick_shown = True
        return True

    def open_big(self, on_quick: Callable[[], None]) -> None:
        """First read of a big events.jsonl: the newest state at once, then the full history.

        The newest state as `RunFollower.newest_first` finds it (unless `open_quick` already took
        it). The bulk read runs without the lock, so the UI keeps drawing meanwhile.
        """
        f = self.follower
        if not self._quick_shown:
            quick = f.newest_first(keep_series=True)  # from the tail: the newest steps plotted at once
            if quick is not None:
                with self.lock:
                    f.adopt(quick)
                    f.poll()
                self._quick_shown = True
                on_quick()
        if self._quick_shown:
            # let the UI paint the header before the bulk read competes with it for the GIL:
            # `frame_shown` comes when the frame is composed; writing it out takes a moment more
            self.frame_shown.wait(2.0)
            time.sleep(FIRST_PAINT_GRACE_S)
        bulk = f.bulk()
        with self.lock:
            f.adopt(bulk)
            self.history_ready = True

    def poll(self, on_quick: Callable[[], None] | None = None) -> WatchUpdate:
        """Read everything new; `on_quick` is called once a big run's header state is ready."""
        f = self.follower
        if (not f.opened or self._quick_shown) and not self._big_read and f.is_big():
            self._big_read = True
            self.open_big(on_quick or (lambda: None))
        with self.lock:
            run = self.follower.poll()
            self.history_ready = True
            sys_new = False
            for raw in self._system_tail.iter_new():
                rec = clean_sample(raw)
                if rec is not None:
                    self.system.add(rec)
                    sys_new = True
            if time.monotonic() - self._nodes_read >= self.nodes_every_s:
                self._nodes_read, cpu = time.monotonic(), time.thread_time()
                self.nodes = self.job.poll()
                spent = time.thread_time() - cpu
                self.nodes_every_s = min(NODES_MAX_EVERY_S, max(NODES_EVERY_S, spent / NODES_CPU_SHARE))
                sys_new = sys_new or bool(self.nodes)
                if self.nodes and self._rank_log(self.log_rank) != self._log.path:   # found its node now
                    self._log, self._log_reset = LogTail(self._rank_log(self.log_rank)), True
            if sys_new:   # each rank's step anatomy, from its heartbeat (a job's: under its node)
                hbs = {r: hb for v in self.nodes for r, hb in v.heartbeats.items()} if self.nodes else read_heartbeats(self.paths)
                self.system.anatomy = {r: hb["anatomy"] for r, hb in hbs.items() if "anatomy" in hb}
            reset, self._log_reset = self._log_reset, False
            lines = self._log.poll()
            pending = self._log.pending()
            changed = reset or pending != self._log_pending
            self._log_pending = pending
            self._check_supervisor()
            return WatchUpdate(run=run, system_changed=sys_new, new_log_lines=lines, log_reset=reset,
                               log_pending=pending if changed else None)

    def _check_supervisor(self) -> None:
        """Every 2 s: does a run that claims to be live still have a supervisor?"""
        st = self.follower.state
        now = time.monotonic()
        named = st.status.supervisor_pid is not None or "supervisor_pid" in st.status.invalid
        if st.is_final or not named or now - self._live_checked < 2.0:
            st.supervisor_lost = False if st.is_final else st.supervisor_lost
            return
        self._live_checked = now
        try:
            from tui.read.rundir import liveness  # psutil loads with the first check
            st.supervisor_lost = liveness(st.status) == "lost"
        except Exception:  # noqa: BLE001 - a failed check must not stop the following
            st.supervisor_lost = False
