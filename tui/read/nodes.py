"""Every node of a job's shared run directory (nodes/<node>/), read incrementally.

One reader for the viewer (`mt watch`, `--once`, `--headless`) and the job supervisor's rules:
per refresh one scandir of nodes/ and, per node, a stat of its status.json (read again only when
it changed), the new bytes of its system.jsonl and its heartbeat files, so the cost grows with
the number of nodes and ranks, never with the number of steps the run has taken. Only the job's
own nodes count (its status.json `job_nodes`), and what each holds is bounded by what the job can
hold (`JobBounds`), here once, so no rule sees a rank, a pid list or a step the job cannot have.
"""
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from mt.contract import door
from mt.contract.config import Config, ConfigError
from mt.contract.events import as_int
from mt.contract.heartbeat import read_heartbeats
from mt.contract.jsonl import JsonlTail
from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json
from mt.contract.status import Status
from mt.contract.system import clean_sample
from tui.read.torchrun_log import Failure

SYSTEM_TAIL_BYTES = 64 * 1024   # a node's newest sample is what is shown: the end of its file is enough
T = TypeVar("T")   # an entry of a node's rank list (a worker pid, a failure, a sample's rank)
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
    anatomy: dict[str, float] = field(default_factory=dict)   # its heartbeat's step anatomy (medians, s)

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
            rv.anatomy = hb.get("anatomy") or {}
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
        if rec is None or as_int(rec.get("exit_code")) in (None, 0):
            return None
        return NodeExit(self.name, attempt, as_int(rec.get("exit_code")), "failed", _failures(rec.get("failures"), self.name))


def _failures(raw: Any, node: str) -> list[Failure]:
    """status.json `failures` (or an attempt record's) as Failures on `node`; what is not one is left out."""
    return [Failure(as_int(f.get("rank"), -1), as_int(f.get("exit_code")), as_int(f.get("pid")), node=node)
            for f in (raw if isinstance(raw, list) else []) if isinstance(f, dict)]


@dataclass(frozen=True)
class JobBounds:
    """What the job can hold, from its own status and config: ranks 0..world-1, at most `nproc` on a
    node, heartbeat steps up to `max_step` (None: unknown, no bound but the heartbeat's own)."""

    world: int | None = None
    nproc: int | None = None
    max_step: int | None = None

    @property
    def ranks(self) -> range | None:
        return None if self.world is None else range(self.world)

    def cut(self, items: list[T], rank: Callable[[T], int]) -> list[T]:
        """The items of a node's list the job can hold, in the list's order: a rank in its world, each
        rank once, the first `nproc` ranks (a failure list keeps its root cause first)."""
        out: list[T] = []
        seen: set[int] = set()
        for item in items:
            r = rank(item)
            if r in seen or (self.world is not None and not 0 <= r < self.world):
                continue
            if self.nproc is not None and len(seen) >= self.nproc:
                break
            seen.add(r)
            out.append(item)
        return out


def bounded_status(st: Status, b: JobBounds) -> Status:
    """A node's status with its rank lists (worker_pids, failures, each attempt's failures) cut to what the job holds."""
    st.worker_pids = dict(b.cut(list(st.worker_pids.items()), lambda kv: int(kv[0])))
    st.failures = _bounded_failures(st.failures, b)
    st.attempts = [{**a, "failures": _bounded_failures(a["failures"], b)} if isinstance(a.get("failures"), list) else a
                   for a in st.attempts]
    return st


def _bounded_failures(raw: list[Any], b: JobBounds) -> list[Any]:
    return b.cut([f for f in raw if isinstance(f, dict) and as_int(f.get("rank")) is not None], lambda f: f["rank"])


def bounded_sample(sample: dict[str, Any], b: JobBounds) -> dict[str, Any]:
    """A node's system sample with the rank entries the job can hold (in its world, `nproc` at most)."""
    return {**sample, "ranks": b.cut(sample["ranks"], lambda e: e["rank"])}


def read_status_if_changed(path: Path, key: tuple[int, int, int] | None) -> tuple[tuple[int, int, int] | None, Status | None]:
    """(the file's key, its Status through the door) when its (inode, size, mtime) is not `key`; (key, None) when unchanged."""
    try:
        st = os.lstat(path)
        now: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        now = None
    if now == key:
        return key, None
    if now is None:
        return None, Status()
    status = Status.parse(door.read_json(path))
    status.written = st.st_mtime
    return now, status


class NodeReader:
    """One node's folder, followed: the status when it changed, the new samples, the heartbeats."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self._status_path = paths.node_status   # a Path built once: a job's viewer polls a thousand files a second
        self.view = NodeView(paths.node or "")
        self._system = JsonlTail.near_end(paths.system, SYSTEM_TAIL_BYTES)
        self._status_key: tuple[int, int, int] | None = None
        self._bounds = JobBounds()   # the bounds its status was cut to: new bounds, the status is read again
        self.new_samples: deque[dict[str, Any]] = deque(maxlen=_KEEP_SAMPLES)   # not yet taken (JobReader.take_samples)

    def poll(self, bounds: JobBounds = JobBounds()) -> NodeView:
        """The node's files now, each value bounded by what the job holds (`bounds`)."""
        if bounds != self._bounds:
            self._status_key, self._bounds = None, bounds
        self._status_key, status = read_status_if_changed(self._status_path, self._status_key)
        if status is not None:
            self.view.status = bounded_status(status, bounds)
        try:
            new = [bounded_sample(s, bounds) for s in map(clean_sample, self._system.iter_new()) if s is not None]
        except OSError:   # not a file (a folder, a FIFO's reader gone): this node shows no sample
            new = []
        if new:
            self.view.sample = new[-1]
            # kept until taken: the supervisor's peer watch polls between the rules' ticks; a reader
            # nobody takes from (the viewer) keeps the last _KEEP_SAMPLES only
            self.new_samples.extend(new)
        self.view.heartbeats = read_heartbeats(self.paths, bounds.ranks, bounds.max_step)
        self.view._ranks = None
        return self.view


def counted_nodes(found: list[str], job: Status) -> tuple[list[str], list[str]]:
    """(the folders that are the job's nodes, those that are not): the nodes its status names
    (`job_nodes`); before it names any, the folders found, `nnodes` of them at most."""
    if job.job_nodes:
        mine = set(job.job_nodes)
        counted = [n for n in found if n in mine]
    else:
        counted = found if job.nnodes is None else found[: job.nnodes]
    kept = set(counted)
    return counted, [n for n in found if n not in kept]


class JobReader:
    """Every node under a run directory's nodes/ that is the job's (none: the one-machine layout)."""

    def __init__(self, run_dir: Path) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.readers: dict[str, NodeReader] = {}
        self.views: list[NodeView] = []   # as the last poll found them
        self.strays: list[str] = []       # folders under nodes/ that are not the job's: never read
        self.job = Status()               # the job's status.json, read again only when it changed
        self._job_key: tuple[int, int, int] | None = None
        self._config: Config | None = None

    def nodes(self) -> tuple[list[str], JobBounds]:
        """The job's node folders now and what the job can hold (`strays` is set too)."""
        self._job_key, job = read_status_if_changed(self.paths.status, self._job_key)
        if job is not None:
            self.job = job
        counted, self.strays = counted_nodes(self.paths.node_names(), self.job)
        return counted, self._bounds()

    def _bounds(self) -> JobBounds:
        """The job's world and nproc from its status (the supervisor's, the shape in force), else its config."""
        if self._config is None:
            try:
                self._config = load_config_json(self.paths.config)
            except ConfigError:
                pass   # not written yet, or unreadable: the job's status alone, read again next poll
        cfg = self._config
        nproc = self.job.nproc or (cfg.launch.nproc_per_node if cfg else None)
        nnodes = self.job.nnodes or len(self.job.job_nodes) or (cfg.launch.nnodes if cfg else None)
        # [train] max_steps is the engine's; a script says its own (run_start): only the heartbeat's bound then
        max_step = cfg.train.max_steps if cfg and not cfg.launch.script else None
        return JobBounds(nproc * nnodes if nproc and nnodes else None, nproc, max_step)

    def poll(self) -> list[NodeView]:
        """Each node's view now, sorted by name; [] for a run directory without nodes/."""
        names, bounds = self.nodes()
        for gone in set(self.readers) - set(names):
            del self.readers[gone]
        views = []
        for name in names:
            reader = self.readers.get(name)
            if reader is None:
                reader = self.readers[name] = NodeReader(self.paths.on(name))
            try:
                views.append(reader.poll(bounds))
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
    """The heartbeats at the top and under each of the job's nodes, by rank (one machine: the top's)."""
    out = read_heartbeats(paths.on(None))
    names, bounds = JobReader(paths.root).nodes()
    for name in names:
        out.update(read_heartbeats(paths.on(name), bounds.ranks, bounds.max_step))
    return out

