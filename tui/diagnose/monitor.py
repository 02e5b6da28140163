"""IncidentMonitor: follows a run directory, runs the rules, keeps incidents.jsonl.

The supervisor hands it a `Tick` about once a second while the run lives and once after a
worker exits: its status, the events it read and the system samples it took, in memory. The
monitor itself reads only what the workers write (heartbeats and, after an exit, the tails of
the logs). `poll()` does the same from the files, for a monitor with no supervisor around it. Every incident is
one `open` line, maybe `update` lines (a capture's stacks), and later one `closed` line with
the same code; a code is never opened again while it is open. Engine-side incidents (from `incident` events) are copied with source
"engine" and closed once `close_after_steps` logged steps show the condition gone.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from mt.contract import door
from mt.contract.config import Config, ConfigError, MonitorConfig
from mt.contract.events import EXIT_CODES, as_float, dumps
from mt.contract.heartbeat import read_heartbeats
from mt.contract.incident import Incident, IncidentLine
from mt.contract.jsonl import JsonlTail
from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json
from mt.contract.records import Record, RecordTail, RunStart, Step, parse_incident, read_records
from mt.contract.status import CLEAN_STATES, FINAL_STATES, Status, read_status
from mt.contract.system import clean_sample
from mt.rules import is_clear
from tui.diagnose.exit import classify_log
from tui.diagnose.findings import Observation, RankProc
from tui.diagnose.memory import RuleMemory, RunFacts
from tui.diagnose.probes import ProcReader, file_size, read_tail, sampled_children
from tui.diagnose.rules import evaluate
from tui.read.nodes import JobReader, NodeView, node_of_ranks
from tui.read.procs import usable_cores
from tui.read.rundir import supervisor_alive

# What stays open once the run is over: the facts that explain how it ended.
KEEP_WHEN_DONE = frozenset({"nan_loss", *EXIT_CODES})
KEEP_WHEN_FAILED = KEEP_WHEN_DONE | {"hang"}


@dataclass
class Tick:
    """What the supervisor knows at one poll, handed to the monitor in memory."""

    now: float
    status: Status                                          # as the supervisor keeps it
    events: Iterable[Record] = ()                           # read since the last tick
    samples: list[dict[str, Any]] = field(default_factory=list)   # system samples taken since
    worker_pids: dict[int, int] = field(default_factory=dict)     # this node's ranks, as found
    supervisor_alive: bool = True                           # the supervisor's own tick: it is


def facts_of(cfg: Config) -> RunFacts:
    """The config values the rules use."""
    return RunFacts(eval_every=cfg.train.eval_every, checkpoint_every=cfg.checkpoint.every_steps,
                    num_workers=cfg.data.num_workers, eval_batches=cfg.train.eval_batches,
                    world_size=cfg.world_size, device=cfg.launch.device, host_cores=usable_cores(),
                    script=bool(cfg.launch.script))


def run_facts(paths: RunPaths) -> RunFacts:
    """facts_of config.json (defaults if it cannot be read)."""
    try:
        return facts_of(load_config_json(paths.config))
    except ConfigError:
        return RunFacts()


class IncidentMonitor:
    """Diagnoses one run directory incrementally and appends to its incidents.jsonl.

    Inside the supervisor it is handed a `Tick` each second (`observe`); on its own (`poll`)
    it reads the same facts from the run directory's files.
    """

    def __init__(self, run_dir: Path, monitor: MonitorConfig, facts: RunFacts | None = None,
                 node: str | None = None, job: JobReader | None = None) -> None:
        """`node`: in a job's shared run directory, the node this monitor runs on (the job's
        supervisor's): its ranks are read in /proc, every other node's from that node's files.
        `job`: the reader of nodes/ to poll (the supervisor's, shared with its peer watch)."""
        self.paths = RunPaths(Path(run_dir))
        self.node = node
        self.job = job or JobReader(self.paths.root)
        self.nodes: dict[int, str] = {}   # rank -> node, in a job
        self._rank_logs: dict[int, Path] = {}   # built once per node map: a job's tick marks a thousand logs
        self.m = monitor
        self.memory = RuleMemory(facts or run_facts(self.paths))
        self.events = RecordTail(self.paths.events)
        self.system = JsonlTail(self.paths.system)
        self.procs = ProcReader()
        self.open: dict[str, dict[str, Any]] = {}
        self.clear_since: dict[str, float] = {}
        self.clean_steps: dict[str, int] = {}
        self.copied: set[tuple[Any, ...]] = set()  # engine incidents already in the file
        self.attempt_seen: Any = None
        self.log_from: dict[Path, int] = {}  # log -> its size when this attempt began
        self.log_mark: dict[int, int] = {}  # rank -> its log's size when the last step was read
        self._resume_file()

    def _resume_file(self) -> None:
        """A monitor started on a run that already has incidents carries on from them."""
        for rec in read_records(self.paths.incidents, parse_incident):
            if rec.source == "engine":
                self.copied.add(_engine_key(rec))
            if rec.status in ("open", "update"):  # an update carries the open record's fields and more
                self.open[rec.code] = rec.raw
                self.clean_steps[rec.code] = 0
            else:
                self.open.pop(rec.code, None)

    # -- the poll --------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> list[dict[str, Any]]:
        """On its own: read what is new from the run directory, then `observe` it."""
        status = read_status(self.paths.root)
        # a job's nodes write their own system.jsonl (the job's reader tails each); the top's is one machine's
        samples = [] if self.job.views else [s for s in map(clean_sample, self.system.iter_new()) if s is not None]
        pids = {int(r): p for r, p in status.worker_pids.items()}
        return self.observe(Tick(time.time() if now is None else now, status, self.events.iter_new(), samples, pids,
                                 supervisor_alive=status.supervisor_pid is None or supervisor_alive(status)))

    def observe(self, tick: Tick) -> list[dict[str, Any]]:
        """Take one tick, run the rules, append and return the records written."""
        out, new_steps = self.take_events(tick.events, tick.now)
        views = self.job.poll()
        samples = tick.samples
        if views:   # a job: this node's samples come in the tick, every other node's from its file, each with its node
            mine = [{**s, "node": self.node} for s in samples] if self.node else samples
            samples = sorted(mine + self.job.take_samples(but=self.node), key=lambda s: s["t"])
        for sample in samples:
            self.memory.feed_system(sample)
        if new_steps:  # the logs up to here belong to a run that was still stepping
            self.log_mark = {r: file_size(self._rank_log(r)) for r in range(self.memory.world_size or 0)}
        obs = self._observe(tick, views)
        obs.new_steps = new_steps
        found = evaluate(self.memory, obs, self.m)
        out += self._lifecycle(found, obs)
        self._append(out)
        return out

    def take_events(self, events: Iterable[Record], now: float) -> tuple[list[dict[str, Any]], int]:
        """Feed events to the rules' memory; returns the engine incidents to copy or close, and
        how many steps this attempt took among them."""
        out: list[dict[str, Any]] = []
        new_steps = 0
        for ev in events:
            self.memory.feed_event(ev)
            if isinstance(ev, IncidentLine):
                out += self._copy_engine(ev, now)
            elif isinstance(ev, Step):
                new_steps += 1
                out += self._engine_clears(ev, now)
            elif isinstance(ev, RunStart):
                new_steps = 0  # the steps read so far belong to an earlier attempt
        return out, new_steps

    def catch_up(self, history: Iterable[Record]) -> None:
        """Read a run's earlier events before the first tick (a resume), rules not yet run."""
        out, _ = self.take_events(history, time.time())
        self._append(out)

    def _observe(self, tick: Tick, views: list[NodeView]) -> Observation:
        now, status = tick.now, tick.status
        if status.attempt != self.attempt_seen:
            # logs are appended across attempts: only what this attempt wrote may explain its end
            self.attempt_seen = status.attempt
            self.log_from = {p: file_size(p) for p in self._logs()}
        if views:   # a job: every node's heartbeats, each rank from the node that names it
            nodes = node_of_ranks(views)
            if nodes != self.nodes:
                self.nodes, self._rank_logs = nodes, {}
            hbs = {r: hb for v in views for r, hb in v.heartbeats.items() if self.nodes.get(r) == v.name}
        else:
            world = self.memory.world_size
            hbs = read_heartbeats(self.paths, range(world) if world else None, self.memory.max_steps)
            if self.nodes:
                self.nodes, self._rank_logs = {}, {}
        self.memory.note_heartbeats(hbs, now, self.m.straggler_steps)
        pids = tick.worker_pids or self._heartbeat_pids(hbs)
        if views:
            pids = {r: p for r, p in pids.items() if self.nodes.get(r, self.node) == self.node}
        progress = self.memory.last_progress_t()
        # the syscall probe is only worth it once the run has been quiet for a couple of seconds,
        # or always for a script that reports nothing (its processes are all there is to read)
        silent = progress is None and self.memory.facts.script
        quiet = silent or progress is not None and now - progress > 2.0
        sample = self.memory.newest_system(self.node if views else None)
        procs = {**_remote_procs(views, set(pids)), **self.procs.read(pids, sample, detailed=quiet)}
        obs = Observation(now, status, hbs, procs, supervisor_alive=tick.supervisor_alive, open_codes=frozenset(self.open),
                          open_evidence={c: {**(r.get("evidence") or {}), "step": r.get("step")} for c, r in self.open.items()},
                          nodes=dict(self.nodes), node_exits={e.node: e for e in self.job.exits(status.attempt)},
                          node_states={v.name: v.status.state for v in views}, node=self.node)
        exited = status.exit_code not in (None, 0) or status.state == "failed" or bool(obs.node_exits)
        ended_well = self.memory.run_end is not None and self.memory.run_end.status in CLEAN_STATES
        if quiet and not ended_well and not exited:
            obs.fresh_error = self._fresh_error()
        if exited or obs.fresh_error or (any(p.alive is False for p in procs.values()) and not ended_well):
            ranks = set(pids) | set(self.nodes) | set(range(self.memory.world_size or 0))
            logs = {r: read_tail(self._rank_log(r), since=self.log_from.get(self._rank_log(r), 0))
                    for r in sorted(ranks)}
            obs.rank_logs = {r: t for r, t in logs.items() if t}
            # this node's torchrun (a job's other nodes report their failed workers themselves: node_exits)
            trl = self.paths.on(self.node).logs / "torchrun.log"
            obs.torchrun_log = read_tail(trl, 65536, since=self.log_from.get(trl, 0))
        return obs

    def _fresh_error(self) -> bool:
        """A rank printed an error since the run last stepped (and no eval/checkpoint is due)."""
        last = self.memory.last_step
        if last is None or self.memory.pauses_due(last.step):
            return False
        for rank, mark in self.log_mark.items():
            kind, _ = classify_log(read_tail(self._rank_log(rank), since=mark))
            if kind in ("exception", "oom", "timeout", "killed"):
                return True
        return False

    def _rank_log(self, rank: int) -> Path:
        """The rank's log: under its node's folder in a job."""
        path = self._rank_logs.get(rank)
        if path is None:
            node = self.nodes.get(rank)
            path = self._rank_logs[rank] = (self.paths if node is None else self.paths.on(node)).rank_log(rank)
        return path

    def _logs(self) -> list[Path]:
        out = []
        for paths in [self.paths, *(self.paths.on(v.name) for v in self.job.views)]:
            try:
                out += [p for p in paths.logs.iterdir() if p.suffix == ".log"]
            except OSError:
                pass
        return out

    def _heartbeat_pids(self, hbs: dict[int, dict[str, Any]]) -> dict[int, int]:
        """Without the supervisor's list of this node's workers (a bare torchrun), the heartbeats name them."""
        pids: dict[int, int] = {}
        for r, hb in hbs.items():
            if isinstance(hb.get("pid"), int) and hb.get("attempt") in (None, self.memory.attempt):
                pids[r] = hb["pid"]
        return pids

    # -- engine-side incidents -------------------------------------------------------------
    def _copy_engine(self, ev: IncidentLine, now: float) -> list[dict[str, Any]]:
        key = _engine_key(ev)
        if key in self.copied or ev.code in self.open:
            self.copied.add(key)
            return []
        self.copied.add(key)
        # t: when it reached this file (like every record); event_t: when the engine raised it
        rec = {**ev.filed(now, "engine"), "event_t": ev.t}
        self.open[ev.code] = rec
        self.clean_steps[ev.code] = 0
        return [rec]

    def _engine_clears(self, step: Step, now: float) -> list[dict[str, Any]]:
        out = []
        for code, rec in list(self.open.items()):
            if rec.get("source") != "engine" or step.step <= as_float(rec.get("step")):
                continue
            if is_clear(code, rec.get("evidence") or {}, step.raw):
                self.clean_steps[code] = self.clean_steps.get(code, 0) + 1
                # fast runs clear N steps in a second: keep it open long enough to be seen
                shown = now - as_float(rec.get("t")) >= self.m.close_after_s
                if self.clean_steps[code] >= self.m.close_after_steps and shown:
                    out.append(self._close(code, now, f"{self.clean_steps[code]} clean steps up to step {step.step}"))
            else:
                self.clean_steps[code] = 0
        return out

    # -- supervisor-side lifecycle ---------------------------------------------------------
    def _lifecycle(self, found: dict[str, Incident], obs: Observation) -> list[dict[str, Any]]:
        out = []
        for code, f in found.items():
            self.clear_since.pop(code, None)
            if code not in self.open:
                rec = f.filed(obs.now, "supervisor")
                self.open[code] = rec
                out.append(rec)
        state = obs.status.state
        if state not in FINAL_STATES and self.memory.run_end is not None:
            # the engine's run_end comes before torchrun and the supervisor finish: settle now,
            # as the supervisor may not poll again once it has written the final state
            state = self.memory.run_end.status
        if state in FINAL_STATES:
            keep = KEEP_WHEN_FAILED if state in ("failed", "killed") else KEEP_WHEN_DONE
            for code in list(self.open):
                if code not in keep and code not in found:
                    out.append(self._close(code, obs.now, f"run {state}"))
            return out
        for code, rec in list(self.open.items()):
            if rec.get("source") != "supervisor" or code in found:
                continue
            since = self.clear_since.setdefault(code, obs.now)
            # a new attempt must be able to report its own crash: exits close at once
            if code in EXIT_CODES or obs.now - since >= self.m.close_after_s:
                out.append(self._close(code, obs.now, f"condition clear for {obs.now - since:.0f} s"))
        return out

    def update(self, code: str, evidence: dict[str, Any], detail: str, now: float | None = None) -> dict[str, Any] | None:
        """Add evidence (and a sentence of detail) to the open incident `code`: one `update` line
        with all its fields; None when it is no longer open (closed before the evidence came)."""
        if code not in self.open:
            return None
        old = self.open[code]   # a new dict: the open record already handed out stays as written
        rec = self.open[code] = {**old, "evidence": {**(old.get("evidence") or {}), **evidence},
                                 "detail": f"{old.get('detail') or ''}; {detail}".lstrip("; ")}
        out = {**rec, "t": time.time() if now is None else now, "status": "update"}
        self._append([out])
        return out

    def note(self, finding: Incident, now: float, closed_reason: str) -> list[dict[str, Any]]:
        """An incident about what is already over (an attempt Slurm cut short): opened and closed at once."""
        rec = finding.filed(now, "supervisor")
        out = [rec, {**rec, "status": "closed", "closed_reason": closed_reason}]
        self._append(out)
        return out

    def _close(self, code: str, now: float, reason: str) -> dict[str, Any]:
        rec = dict(self.open.pop(code))
        self.clear_since.pop(code, None)
        self.clean_steps.pop(code, None)
        rec.update(t=now, status="closed", closed_reason=reason)
        return rec

    def _append(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        fd = door.open_append(self.paths.incidents)
        try:
            for rec in records:  # one write per line: a reader never sees half of one
                os.write(fd, (dumps(rec) + "\n").encode())
        finally:
            os.close(fd)


def _remote_procs(views: list[NodeView], local: set[int]) -> dict[int, RankProc]:
    """Ranks of a job's other nodes, as their node's newest sample shows them (their pids are another
    machine's; the system call and DataLoader workers as that node read them in its /proc)."""
    out = {}
    for v in views:
        for rv in v.ranks():
            if rv.rank not in local and rv.rank not in out:
                out[rv.rank] = RankProc(rv.rank, rv.pid, rv.alive, rv.cpu_pct, syscall=rv.syscall,
                                        children=sampled_children(rv.workers), remote=True)
    return out


def _engine_key(rec: IncidentLine) -> tuple[Any, ...]:
    """An engine incident's identity, the same for its event and for its copy in incidents.jsonl."""
    t = rec.event_t if rec.source is not None else rec.t
    return (rec.code, rec.step, None if t is None else round(t, 3))
