"""The rules' memory between polls: recent steps, pauses and system samples of a run (not signals)."""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

from mt.contract.events import CONTROL_ACTIONS, as_float
from mt.contract.records import Checkpoint, ControlEvent, Eval, Record, RunEnd, RunStart, Step

# Steps right after an attempt starts carry worker start-up, first-batch and allocator
# warm-up costs; no rate or share is judged on them.
WARMUP_STEPS = 3
_KEEP_STEPS = 4000
_KEEP_SYSTEM_S = 600.0
_KEEP_JOB_SYSTEM_S = 60.0   # the rules' windows are 20-30 s by default


@dataclass
class StepRec:
    """The timing fields of one `step` event."""

    t: float
    step: int
    step_time_s: float
    data_wait_s: float
    tokens_per_s: float
    interval_s: float = float("nan")
    """Wall time since the previous logged step of this attempt, per step logged in between."""


@dataclass
class RunFacts:
    """Config values the rules need (all optional: a rule copes without them)."""

    eval_every: int = 0
    checkpoint_every: int = 0
    num_workers: int | None = None
    eval_batches: int = 0
    world_size: int | None = None
    device: str | None = None
    host_cores: int | None = None
    script: bool = False  # a user's script ([launch] script): it may report nothing through mt


def _f(v: float | None) -> float:
    return math.nan if v is None else v


class RuleMemory:
    """Accumulates the event and system streams; the current attempt's steps and pauses."""

    def __init__(self, facts: RunFacts | None = None) -> None:
        self.facts = facts or RunFacts()
        self.attempt: int | None = None
        self.attempt_t0: float | None = None
        self.start_step = 0
        self.world_size: int | None = self.facts.world_size
        self.steps: deque[StepRec] = deque(maxlen=_KEEP_STEPS)
        self.pauses: dict[int, set[str]] = {}  # step -> {"eval", "checkpoint"} done after it
        self.max_steps: int | None = None
        self.params_total: int | None = None
        self.pending_request = False  # a checkpoint/stop request accepted, not yet written
        self.pause_s: dict[str, float] = {}  # kind -> longest pause seen (this run)
        self.last_event_t: float | None = None
        self.run_end: RunEnd | None = None
        self.backend: str | None = None   # the attempt's process-group backend, from its run_start
        self.system: deque[dict[str, Any]] = deque()
        self.sampled_nodes: set[str] = set()   # a job's nodes whose samples came
        self.step_times: dict[int, float] = {}  # step -> event time, for pause lengths
        self.heartbeat_lag: dict[int, tuple[int, float]] = {}  # rank -> (steps behind, since when)
        self.blocked_on_input_since: float | None = None  # a silent script's ranks all waiting on their loaders
        self.stuck: tuple[tuple[int, ...], float] | None = None  # the ranks a quiet run waits for, since when
        self.slow_since: tuple[int, float] | None = None  # the rank slower than the others by the held share, since when

    # -- feeding ---------------------------------------------------------------------------
    def feed_event(self, ev: Record) -> None:
        t = ev.t
        if t is not None:
            self.last_event_t = t if self.last_event_t is None else max(self.last_event_t, t)
        if isinstance(ev, RunStart):
            self._new_attempt(ev)
        elif isinstance(ev, Step):
            self._step(ev)
        elif isinstance(ev, (Eval, Checkpoint)):
            self._pause(ev)
        elif isinstance(ev, RunEnd):
            self.run_end = ev
        elif isinstance(ev, ControlEvent) and ev.action in CONTROL_ACTIONS:
            self.pending_request = ev.status == "accepted"

    def _new_attempt(self, ev: RunStart) -> None:
        self.attempt = ev.attempt or 1
        self.attempt_t0 = ev.t
        self.start_step = ev.start_step
        self.world_size = ev.world_size or self.world_size
        self.max_steps = ev.max_steps or None
        self.params_total = ev.params_total or self.params_total
        self.backend = ev.backend or self.backend
        self.pending_request = False
        self.steps.clear()
        self.step_times.clear()
        self.run_end = None

    def _step(self, ev: Step) -> None:
        t = _f(ev.t)
        prev = self.steps[-1] if self.steps else None
        interval = (t - prev.t) / (ev.step - prev.step) if prev and ev.step > prev.step else math.nan
        self.steps.append(StepRec(t, ev.step, _f(ev.step_time_s), _f(ev.data_wait_s), _f(ev.tokens_per_s), interval))
        if ev.t is not None:
            self.step_times[ev.step] = ev.t
        if len(self.step_times) > _KEEP_STEPS:
            self.step_times.pop(next(iter(self.step_times)))

    def _pause(self, ev: Eval | Checkpoint) -> None:
        self.pauses.setdefault(ev.step, set()).add(ev.kind)
        if isinstance(ev, Checkpoint):
            self.pending_request = False
        began = self.step_times.get(ev.step)
        if began is not None and ev.t is not None:
            self.pause_s[ev.kind] = max(self.pause_s.get(ev.kind, 0.0), ev.t - began)

    @property
    def nccl(self) -> bool:
        """The ranks wait for each other in NCCL (run_start's backend, else a CUDA launch): a waiting
        rank spins on its CPU and GPU, so "running" in /proc is no sign of being stuck."""
        return self.backend == "nccl" if self.backend else self.facts.device == "cuda"

    def feed_system(self, sample: dict[str, Any]) -> None:
        """One sample as `mt.contract.system.clean_sample` returns it (its t is a float; in a job, its `node`)."""
        t = sample["t"]
        self.system.append(sample)
        if sample.get("node") is not None:
            self.sampled_nodes.add(sample["node"])
        # a job's nodes all sample: memory stays that of one machine's ten minutes (a minute at least)
        keep = max(_KEEP_JOB_SYSTEM_S, _KEEP_SYSTEM_S / len(self.sampled_nodes)) if self.sampled_nodes else _KEEP_SYSTEM_S
        while self.system and t - self.system[0]["t"] > keep:
            self.system.popleft()

    def note_heartbeats(self, heartbeats: dict[int, dict[str, Any]], now: float, min_lag: int) -> None:
        """Track since when each rank has been `min_lag`+ steps behind the leading one."""
        steps = {}
        for rank, hb in heartbeats.items():
            s = as_float(hb.get("step"))
            if math.isfinite(s) and (self.attempt is None or hb.get("attempt") in (None, self.attempt)):
                steps[rank] = int(s)
        top = max(steps.values(), default=0)
        for rank, s in steps.items():
            lag = top - s
            if lag >= min_lag:
                _, since = self.heartbeat_lag.get(rank, (lag, now))
                self.heartbeat_lag[rank] = (lag, since)
            else:
                self.heartbeat_lag.pop(rank, None)
        for rank in set(self.heartbeat_lag) - set(steps):
            del self.heartbeat_lag[rank]

    # -- questions the rules ask -----------------------------------------------------------
    @property
    def last_step(self) -> StepRec | None:
        return self.steps[-1] if self.steps else None

    def judged(self, rec: StepRec) -> bool:
        """Whether a step's timing is representative: past warm-up, not right after a pause."""
        if rec.step <= self.start_step + WARMUP_STEPS:
            return False
        # An eval/checkpoint runs after its step is logged: the next step's wall time (and,
        # in engines that time steps end to end, its step time) carries the pause.
        return rec.step - 1 not in self.pauses

    def median_step_time(self, last: int = 50) -> float | None:
        times = [r.step_time_s for r in list(self.steps)[-last * 2:] if self.judged(r) and not math.isnan(r.step_time_s)]
        if not times:
            times = [r.step_time_s for r in self.steps if not math.isnan(r.step_time_s)]
        return statistics.median(times[-last:]) if times else None

    def median_step_interval(self, last: int = 50) -> float | None:
        """Median wall time between consecutive logged steps (includes any per-step sleep)."""
        gaps = [r.interval_s for r in list(self.steps)[-last:] if self.judged(r) and not math.isnan(r.interval_s)]
        return statistics.median(gaps) if gaps else self.median_step_time(last)

    def pauses_due(self, step: int) -> set[str]:
        """The pauses the engine is due to take after this step and has not reported yet."""
        f, due = self.facts, set()
        final = self.max_steps is not None and step >= self.max_steps
        if self.pending_request or final or (f.checkpoint_every and step % f.checkpoint_every == 0):
            due.add("checkpoint")
        if f.eval_every and (step % f.eval_every == 0 or final):
            due.add("eval")
        return due - self.pauses.get(step, set())

    def pause_allowance(self, kind: str) -> float:
        """Seconds a pause of this kind may take: 3x the longest seen, else an estimate."""
        seen = self.pause_s.get(kind)
        if seen is not None:
            return 3 * seen
        interval = self.median_step_interval() or 1.0
        if kind == "eval":
            return 2 * max(1, self.facts.eval_batches) * interval
        # weights + two AdamW moments + a copy in flight, written at a slow 50 MB/s
        return 16 * (self.params_total or 0) / 50e6

    def recent_system(self, now: float, window_s: float, node: str | None = None) -> list[dict[str, Any]]:
        """System samples of the last window_s seconds, oldest first (`node`: that node's of a job; None: all)."""
        out = []
        for s in reversed(self.system):
            if now - s["t"] > window_s:
                break
            if node is None or s.get("node") == node:
                out.append(s)
        return out[::-1]

    def newest_system(self, node: str | None = None) -> dict[str, Any] | None:
        """The newest system sample (`node`: that node's, in a job whose nodes all sample; None: any)."""
        return next((s for s in reversed(self.system) if node is None or s.get("node") == node), None)

    def last_progress_t(self) -> float | None:
        """When the run last showed it was moving: any event of this attempt."""
        return self.last_event_t
