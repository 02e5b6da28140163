"""Following a run directory into a TensorBoard log: the live mirror (supervisor) and `mt export --tensorboard`.

The mirror reads events.jsonl, system.jsonl and incidents.jsonl with its own tails and, live,
keeps how far it got in mirror.json, so a new supervisor (`mt resume`) appends to the same log
where the last one stopped. Steps: a point is written once per tag and step; an attempt that
restarts from an older checkpoint (run_start's start_step below what was written) purges the
steps it redoes, so the log holds each step's newest value and never goes backwards.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from mt.contract import door
from mt.contract.config import Config
from mt.contract.jsonl import JsonlTail, write_json_atomic
from mt.contract.paths import RunPaths
from mt.contract.records import Eval, Metrics, RecordTail, RunStart, Sample, Step, parse_incident
from mt.contract.system import clean_sample
from tui.mirror.points import incident_text, sample_text, sample_values, step_values

STATE_VERSION = 1
_MAX_BYTES = 8 << 20  # read per poll: a long history catches up over several ticks, never in one stall


@dataclass
class MirrorState:
    """One mirror's entry in mirror.json: where each tail stopped and which steps each tag holds."""

    target: str = ""
    events: tuple[int, int | None] = (0, None)      # (offset, inode) of the next unread line
    system: tuple[int, int | None] = (0, None)
    incidents: tuple[int, int | None] = (0, None)
    written: dict[str, int] = field(default_factory=dict)  # tag -> newest step written
    samples: int = 0                                  # system samples written (the next one's number)
    sink: dict[str, Any] = field(default_factory=dict)  # the sink's own (W&B: its run id, newest step)
    v: int = STATE_VERSION

    @classmethod
    def load(cls, path: Path, name: str, target: str) -> MirrorState:
        """Mirror `name`'s saved state; a fresh one (the mirror starts over) if absent, damaged (not JSON,
        a value of the wrong type or out of range, not a regular file, a link) or for another target."""
        whole = door.read_json(path)   # a FIFO or a link there is refused, never waited on or followed
        raw = whole.get(name) if isinstance(whole, dict) else None
        if not isinstance(raw, dict) or raw.get("v") != STATE_VERSION or raw.get("target") != target:
            return cls(target=target)
        spots = {k: _spot(raw.get(k)) for k in ("events", "system", "incidents")}
        written, samples, sink = raw.get("written"), raw.get("samples"), raw.get("sink", {})
        if (any(v is None for v in spots.values()) or not isinstance(written, dict) or not _count(samples)
                or not all(_count(v) for v in written.values()) or not isinstance(sink, dict)):
            return cls(target=target)
        return cls(target, written=dict(written), samples=samples, sink=sink, **spots)


def _count(v: Any) -> bool:
    """A whole number >= 0 (JSON's true, 1.5 or 1e400 is none): offsets, steps, sample counts."""
    return type(v) is int and v >= 0


def _spot(v: Any) -> tuple[int, int | None] | None:
    """A tail's saved (offset, inode), or None if it is not one (a negative offset would fail every poll)."""
    if isinstance(v, list) and len(v) == 2 and _count(v[0]) and (v[1] is None or _count(v[1])):
        return v[0], v[1]
    return None


@dataclass
class Fed:
    """Records the supervisor read from events.jsonl: from byte `start` to `end` (offset, inode)."""

    records: list[Any]
    start: int
    end: tuple[int, int | None]


def logdir_for(paths: RunPaths, setting: str) -> Path:
    """[monitor] tensorboard: relative to the run directory, or absolute (~ expanded)."""
    p = Path(setting).expanduser()
    return p if p.is_absolute() else paths.root / p


class Mirror:
    """Copies what the run directory holds into a sink (TensorBoardSink); `poll` catches up."""

    def __init__(self, paths: RunPaths, sink: Any, state: MirrorState) -> None:
        self.paths, self.sink, self.state = paths, sink, state
        self.events = RecordTail(paths.events, *state.events)
        self.system = JsonlTail(paths.system, *state.system)
        self.incidents = RecordTail(paths.incidents, *state.incidents, parse=parse_incident)

    def poll(self, max_bytes: int | None = _MAX_BYTES, fed: Fed | None = None) -> None:
        """Mirror everything new since the last poll, flush, and note how far it got (in `state`).

        `fed`: the supervisor's own records of events.jsonl since the last poll, so the file is parsed
        once (a third of the mirror's CPU); what precedes them its own tail reads, once."""
        st = self.state
        if fed is None:
            self._events(self.events.iter_new(max_bytes))
            st.events = (self.events.line_offset, self.events.ino)
        else:
            behind = fed.start - st.events[0]
            if behind > 0:  # history since the last mirror's state that the supervisor read before this one opened
                self._events(self.events.iter_new(behind))
            self._events(fed.records)
            st.events = fed.end
        for raw in self.system.iter_new(max_bytes):
            sample = clean_sample(raw)
            if sample is not None:
                self.sink.samples(st.samples, sample["t"], sample_values(sample))
                st.samples += 1
        for inc in self.incidents.iter_new(max_bytes):
            self.sink.text(st.samples, inc.t or time.time(), f"incidents/{inc.code}", incident_text(inc))
        self.sink.flush()
        st.sink = self.sink.state()
        st.system = (self.system.line_offset, self.system.ino)
        st.incidents = (self.incidents.line_offset, self.incidents.ino)

    def _events(self, records: Iterable[Any]) -> None:
        st = self.state
        for rec in records:
            if isinstance(rec, RunStart):
                self._attempt(rec)
            elif isinstance(rec, (Step, Eval, Metrics)):
                fresh = {t: v for t, v in step_values(rec).items() if rec.step > st.written.get(t, -1)}
                if fresh:
                    self.sink.scalars(rec.step, rec.t or time.time(), fresh, train_step=isinstance(rec, Step))
                    st.written.update(dict.fromkeys(fresh, rec.step))
            elif isinstance(rec, Sample):
                tag, text = sample_text(rec)
                if rec.step > st.written.get(tag, -1):  # once per prompt and step, as a scalar is
                    self.sink.text(rec.step, rec.t or time.time(), tag, text, train_step=True)
                    st.written[tag] = rec.step

    def _attempt(self, rec: RunStart) -> None:
        """An attempt from an older checkpoint redoes the steps after it: purge them from the log."""
        st = self.state
        if any(s > rec.start_step for s in st.written.values()):
            self.sink.rollback(rec.start_step + 1, rec.t or time.time())
            st.written = {t: min(s, rec.start_step) for t, s in st.written.items()}

    def close(self) -> None:
        self.sink.close()


def open_tensorboard(paths: RunPaths, logdir: Path, state_path: Path | None) -> Mirror:
    """A mirror into `logdir`; with state_path it continues where mirror.json says."""
    from tui.mirror.tensorboard import TensorBoardSink

    logdir = logdir.resolve()
    state = MirrorState.load(state_path, "tensorboard", str(logdir)) if state_path else MirrorState(target=str(logdir))
    return Mirror(paths, TensorBoardSink(logdir), state)


def open_wandb(paths: RunPaths, cfg: Config, state_path: Path, log: logging.Logger) -> Mirror:
    """A mirror into the one W&B run of this run directory (its id kept in mirror.json)."""
    from tui.mirror.wandbsink import WandbSink, wandb_target

    state = MirrorState.load(state_path, "wandb", wandb_target(cfg.monitor.wandb))
    sink = WandbSink(paths, cfg, state.sink, log)
    if sink.run_id != state.sink.get("id"):   # a new W&B run (its kept entry missing or damaged): from the beginning
        state = MirrorState(target=state.target)
    return Mirror(paths, sink, state)


def save_states(path: Path, mirrors: dict[str, Mirror]) -> None:
    """mirror.json: every mirror's state, in one atomic write."""
    write_json_atomic(path, {name: dataclasses.asdict(m.state) for name, m in mirrors.items()})


def export_tensorboard(paths: RunPaths, logdir: Path) -> None:
    """Write a whole run (finished or not: what it holds now) into a TensorBoard log."""
    mirror = open_tensorboard(paths, logdir, None)
    try:
        mirror.poll(max_bytes=None)
    finally:
        mirror.close()


class MirrorHook:
    """The supervisor's mirrors ([monitor] tensorboard, wandb): polled each tick (the first poll opens them,
    after the attempt started); a failure is logged and turns that mirror off, never reaching the run."""

    def __init__(self, paths: RunPaths, cfg: Config, log: logging.Logger, events_at: int = 0) -> None:
        """`events_at`: where the supervisor's events tail stands (after its catch-up of earlier attempts)."""
        self.paths, self.cfg, self.log = paths, cfg, log
        self.events_at = events_at
        self.mirrors: dict[str, Mirror] = {}
        on = cfg.launch.node_rank == 0  # the events live with node 0
        self.pending = [n for n, v in (("tensorboard", cfg.monitor.tensorboard), ("wandb", cfg.monitor.wandb)) if v and on]

    def _open(self) -> None:
        for name in self.pending:
            try:
                if name == "wandb":
                    self.mirrors[name] = open_wandb(self.paths, self.cfg, self.paths.mirror, self.log)
                else:
                    self.mirrors[name] = open_tensorboard(self.paths, logdir_for(self.paths, self.cfg.monitor.tensorboard), self.paths.mirror)
                self.log.info("mirroring into %s at %s", name, self.mirrors[name].state.target)
            except Exception:
                self.log.exception("cannot start the %s mirror; the run goes on without it", name)
        self.pending = []

    def poll(self, news: list[Any], events_end: tuple[int, int | None]) -> None:
        """Mirror what is new: `news`, the supervisor's records from events.jsonl since the last
        poll, up to `events_end` (its tail's offset and inode)."""
        self._open()
        fed, self.events_at = Fed(news, self.events_at, events_end), events_end[0]
        for name, mirror in list(self.mirrors.items()):
            try:
                mirror.poll(fed=fed)
            except Exception:
                self.log.exception("the %s mirror failed; it is off for the rest of this supervisor", name)
                self._close(name)
        if self.mirrors:
            try:
                save_states(self.paths.mirror, self.mirrors)
            except OSError:
                self.log.exception("cannot write %s", self.paths.mirror)

    def _close(self, name: str) -> None:
        mirror = self.mirrors.pop(name)
        try:
            mirror.close()
        except Exception:
            self.log.exception("cannot close the %s mirror", name)

    def close(self) -> None:
        for name in list(self.mirrors):
            self._close(name)
