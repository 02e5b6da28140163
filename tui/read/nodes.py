"""Every node of a job's shared run directory (nodes/<node>/), read incrementally.

One reader for the viewer (`mt watch`, `--once`, `--headless`) and the job supervisor's rules:
per refresh one scandir of nodes/ and, per node, a stat of its status.json (read again only when
it changed), the new bytes of its system.jsonl and its heartbeat files, so the cost grows with
the number of nodes and ranks, never with the number of steps the run has taken.
"""
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mt.contract.heartbeat import read_heartbeats
from mt.contract.jsonl import JsonlTail
from mt.contract.paths import RunPaths
from mt.contract.status import Status, read_status
from mt.contract.system import clean_sample
from tui.run.torchrun import Failure

SYSTEM_TAIL_BYTES = 64 * 1024   # a node's newest sample is what is shown: the end of its file is enough
_KEEP_SAMPLES = 60              # a node's samples waiting for the rules: a minute at one a second


@dataclass
class RankView:
    """One rank as its node's files show it: heartbeat, the newest sample's process reading."""

    rank: int
    node: str
    step: int | None = None
    beat_t: float | None = None
    phase: str | None = None
    attempt: int | None = None
    pid: int | None = None
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    alive: bool | None = None
    syscall: str | None = None          # sampled by a job's other node (system.jsonl `syscall`, `workers`)
    workers: list[dict[str, Any]] = field(default_factory=list)

    def beat_age(self, now: float) -> float | None:
        return None if self.beat_t is None else max(0.0, now - self.beat_t)


@dataclass
class NodeExit:
    """A node's failed attempt, as its supervisor recorded it: torchrun's exit and the workers that
    failed there, each with its node (the one form a crash on another node reaches the rules in)."""

    node: str
    attempt: int | None
    exit_code: int | None
    state: str | None
    failures: list[Failure] = field(default_factory=list)


@dataclass
class NodeView:
    """One node's supervisor status, newest system sample and heartbeats."""

    name: str
    status: Status = field(default_factory=Status)
    sample: dict[str, Any] | None = None
    heartbeats: dict[int, dict[str, Any]] = field(default_factory=dict)
    _ranks: list[RankView] | None = field(default=None, repr=False, compare=False)

    def ranks(self) -> list[RankView]:
        """Every rank this node's files name (heartbeats, the sample, status worker_pids), by rank
        (built once per poll: the view, the panel and the rules all ask)."""
        if self._ranks is None:
            self._ranks = self._build_ranks()
        return self._ranks

    def _build_ranks(self) -> list[RankView]:
        out: dict[int, RankView] = {}
        for r, pid in self.status.worker_pids.items():
            out[int(r)] = RankView(int(r), self.name, pid=pid)
        for entry in (self.sample or {}).get("ranks") or []:
            rv = out.setdefault(entry["rank"], RankView(entry["rank"], self.name))
            rv.pid = entry.get("pid") or rv.pid
            rv.cpu_pct, rv.rss_bytes, rv.alive = entry.get("cpu_pct"), entry.get("rss_bytes"), entry.get("alive")
            rv.syscall, rv.workers = entry.get("syscall"), entry.get("workers") or []
        for r, hb in self.heartbeats.items():
            rv = out.setdefault(r, RankView(r, self.name))
            rv.step, rv.beat_t, rv.phase, rv.attempt = hb["step"], hb["t"], hb.get("phase"), hb.get("attempt")
            rv.pid = rv.pid or hb.get("pid")
        return [out[r] for r in sorted(out)]

    def failed(self, attempt: int | None) -> NodeExit | None:
        """This node's failure in `attempt` (None: the current one): from its status while it is
        still that attempt, from the attempt's record once it has started the next; None if it did not fail."""
        st = self.status
        if attempt is None or st.attempt in (None, attempt):
            if st.exit_code in (None, 0) and st.state != "failed":
                return None
            return NodeExit(self.name, st.attempt, st.exit_code, st.state, _failures(st.failures, self.name))
        if (st.attempt or 0) < attempt:   # an earlier attempt's failure is explained already
            return None
        rec = next((a for a in st.attempts if a.get("attempt") == attempt), None)
        if rec is None or _int(rec.get("exit_code")) in (None, 0):
            return None
        return NodeExit(self.name, attempt, _int(rec.get("exit_code")), "failed", _failures(rec.get("failures"), self.name))


def _failures(raw: Any, node: str) -> list[Failure]:
    """status.json `failures` (or an attempt record's) as Failures on `node`; what is not one is left out."""
    return [Failure(_int(f.get("rank"), -1), _int(f.get("exit_code")), _int(f.get("pid")), node=node)
            for f in (raw if isinstance(raw, list) else []) if isinstance(f, dict)]


def _int(v: Any, default: int | None = None) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


class NodeReader:
    """One node's folder, followed: the status when it changed, the new samples, the heartbeats."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self._status_path = paths.node_status   # a Path built once: a job's viewer polls a thousand files a second
        self.view = NodeView(paths.node or "")
        self._system = JsonlTail.near_end(paths.system, SYSTEM_TAIL_BYTES)
        self._status_key: tuple[int, int, int] | None = None
        self.new_samples: deque[dict[str, Any]] = deque(maxlen=_KEEP_SAMPLES)   # not yet taken (JobReader.take_samples)

    def poll(self) -> NodeView:
        try:
            st = os.stat(self._status_path)
            key: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = None
        if key != self._status_key:
            self._status_key = key
            self.view.status = read_status(self.paths.root, self.paths.node) if key is not None else Status()
        try:
            new = [s for s in map(clean_sample, self._system.iter_new()) if s is not None]
        except OSError:   # not a file (a folder, a FIFO's reader gone): this node shows no sample
            new = []
        if new:
            self.view.sample = new[-1]
            # kept until taken: the supervisor's peer watch polls between the rules' ticks; a reader
            # nobody takes from (the viewer) keeps the last _KEEP_SAMPLES only
            self.new_samples.extend(new)
        self.view.heartbeats = read_heartbeats(self.paths)
        self.view._ranks = None
        return self.view


class JobReader:
    """Every node under a run directory's nodes/ (none: the one-machine layout)."""

    def __init__(self, run_dir: Path) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.readers: dict[str, NodeReader] = {}
        self.views: list[NodeView] = []   # as the last poll found them

    def poll(self) -> list[NodeView]:
        """Each node's view now, sorted by name; [] for a run directory without nodes/."""
        names = self.paths.node_names()
        for gone in set(self.readers) - set(names):
            del self.readers[gone]
        views = []
        for name in names:
            reader = self.readers.get(name)
            if reader is None:
                reader = self.readers[name] = NodeReader(self.paths.on(name))
            try:
                views.append(reader.poll())
            except (OSError, ValueError):   # a folder that vanished or turned hostile mid-read
                continue
        self.views = views
        return views

    def take_samples(self, but: str | None = None) -> list[dict[str, Any]]:
        """The system samples every node (`but` one, whose own the caller has) wrote since the last
        take, each with its `node`, node by node."""
        out = []
        for name, reader in self.readers.items():
            if name != but:
                out += [{**s, "node": name} for s in reader.new_samples]
            reader.new_samples.clear()
        return out

    def exits(self, attempt: int | None, but: str | None = None) -> list[NodeExit]:
        """The nodes (`but` one) that failed `attempt`, as the last poll read them, by name: the one
        place that decides whether a node failed."""
        found = (v.failed(attempt) for v in self.views if v.name != but)
        return [e for e in found if e is not None]


def node_of_ranks(views: list[NodeView]) -> dict[int, str]:
    """rank -> the node whose files name it (a rank on two nodes: the one with the newer heartbeat)."""
    out: dict[int, tuple[float, str]] = {}
    for v in views:
        for rv in v.ranks():
            t = rv.beat_t if rv.beat_t is not None and math.isfinite(rv.beat_t) else -math.inf
            if rv.rank not in out or t > out[rv.rank][0]:
                out[rv.rank] = (t, v.name)
    return {r: n for r, (_, n) in out.items()}


def called_mt_init(paths: RunPaths, attempt: int | None) -> bool:
    """Whether a script run's ranks called mt.init in `attempt`: its first beat is a heartbeat of that attempt."""
    return any(hb.get("attempt") == attempt for hb in every_heartbeat(paths).values())


def every_heartbeat(paths: RunPaths) -> dict[int, dict[str, Any]]:
    """The heartbeats at the top and under every node's folder, by rank (one machine: the top's)."""
    out = read_heartbeats(paths.on(None))
    for name in paths.node_names():
        out.update(read_heartbeats(paths.on(name)))
    return out
