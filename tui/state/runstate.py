"""Reduce a run directory (events.jsonl, status.json, incidents.jsonl) into a `RunState`.

Pure logic, no Textual: `RunFollower.poll()` reads only the bytes appended since the last
call; `load_run_state()` is the one-shot read used by `mt ls` / `mt watch --once`.
"""
from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from mt.contract.config import MonitorConfig
from mt.contract.events import EXIT_CODES, FAILURE_CODES, as_float, as_int
from mt.contract.incident import IncidentLine
from mt.contract.jsonl import read_json
from mt.contract.paths import RunPaths
from mt.contract.records import Checkpoint, ControlEvent, Eval, Knob, Metrics, Record, RollbackEvent, RunEnd, RunStart, Sample, Step
from mt.contract.status import FINAL_STATES, Status
from tui.state.answers import ControlAnswer, note_answer
from tui.state.samples import EvalOutputs

if TYPE_CHECKING:
    from tui.state.runseries import RunSeries

STALLED_CODES = ("hang", "dataloader_stall")   # open, they say the run makes no progress
REPLAY_CODES = ("nan_loss", "loss_spike", "grad_explosion")   # the incidents `mt replay` finds the cause of


@dataclass
class CheckpointInfo:
    """The newest checkpoint the engine reported."""

    step: int
    path: str
    t: float
    reason: str = ""
    request_id: str | None = None
    seconds: float | None = None      # the whole write
    blocking_s: float | None = None   # what the loop waited of it
    logged: tuple[float | None, float | None, float | None] | None = None  # (loss, lr, grad_norm) logged at its step

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.t)


@dataclass
class RunState:
    """Everything the header, `mt ls` and `mt watch --once` show about one run."""

    run_dir: Path
    name: str = ""
    state: str = "starting"
    attempt: int = 0
    step: int | None = None
    max_steps: int | None = None
    start_step: int = 0
    loss: float | None = None
    best_loss: float | None = None
    best_loss_step: int | None = None
    best_loss_partial: bool = False    # best_loss covers only the newest steps (quick read)
    # (step, loss) each time the best improved, so a resume that rolls back drops the bests after it
    best_history: list[tuple[int | None, float]] = field(default_factory=list, repr=False)
    val_loss: float | None = None
    val_loss_step: int | None = None
    evals: EvalOutputs = field(default_factory=EvalOutputs)   # the newest eval's samples and factory numbers
    lr: float | None = None
    grad_norm: float | None = None
    grad_clip: float | None = None
    epoch: float | None = None         # the newest step's: whole (engine) or fractional (a Trainer's 1.25)
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    mfu_estimated: bool = False  # the newest mfu counts 6 x params FLOPs per token (a user's model, uncounted)
    world_size: int | None = None
    nnodes: int | None = None
    device: str | None = None
    backend: str | None = None
    precision: str | None = None
    strategy: str | None = None
    activation_checkpointing: bool = False
    compile: bool = False
    effective_batch: int | None = None
    tokens_per_step: int | None = None
    params_total: int | None = None
    params_active: int | None = None
    params_trainable: int | None = None
    loss_floor: float | None = None    # run_start data_loss_floor (synthetic data): the best loss possible
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None          # status.json reason, else run_end reason
    run_end_status: str | None = None
    run_end_reason: str | None = None
    last_event_t: float | None = None
    last_checkpoint: CheckpointInfo | None = None
    best_checkpoints: dict[int, float] = field(default_factory=dict)  # [checkpoint] keep_best's, best first
    best_metric: str | None = None
    # each incident as the line that opened it (an engine event or the supervisor's), its own copy: updated in place, open until closed
    incidents: list[IncidentLine] = field(default_factory=list)
    controls: dict[str, ControlAnswer] = field(default_factory=dict)
    knobs: dict[str, float] = field(default_factory=dict)  # lasting knobs turned (knob events): the header's "lr×0.5"
    causes: dict[int, str] = field(default_factory=dict)   # {step: cause} from mt replay's reports (tui/read/replay.py)
    bad_lines: int = 0                 # lines no reader may use (docs/events.md)
    bad_reason: str = ""               # why the newest of them was skipped
    supervisor_lost: bool = False      # status says live but its supervisor process is gone
    script: str | None = None          # a user's script ([launch] script) instead of mt's engine
    n_steps: int = 0                   # step events seen (all attempts)
    rollbacks: int = 0                 # rollbacks so far (the newest rollback event's count: cumulative)
    rollback: RollbackEvent | None = field(default=None, repr=False)   # the newest one
    attempt_t: float | None = None     # when the newest run_start was written
    args: dict | None = field(default=None, repr=False)   # a script's own config (mt.init config=, a Trainer's arguments), newest attempt's
    mt_init_attempt: int | None = None # the attempt a script's heartbeat names: it called mt.init (tui/read/follower.py)
    status: Status = field(default_factory=Status, repr=False)   # found: False until status.json is read
    # (t, step) of recent step events, for a wall-clock ETA that includes eval/ckpt pauses
    recent: deque = field(default_factory=lambda: deque(maxlen=64), repr=False)
    # the run's own hang limits ([monitor]): no step for max(floor, factor x the time between steps)
    hang_floor_s: float = MonitorConfig.hang_floor_s
    hang_step_factor: float = MonitorConfig.hang_step_factor

    @property
    def open_incidents(self) -> list[IncidentLine]:
        return [i for i in self.incidents if i.status == "open"]

    @property
    def shown_state(self) -> str:
        """The state to show: tui/read/rundir.py effective_state, from the liveness the reader last saw."""
        return "lost" if self.supervisor_lost else self.state

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    def script_hint(self) -> str | None:
        """For a script with no step yet: what `run.step` would add. That it reports nothing through
        mt is said only once its attempt ended so; before, it may still be on its way to mt.init."""
        if self.script is None or self.attempt_t is not None or self.n_steps or self.state == "starting" \
                or self.mt_init_attempt == self.attempt:
            return None
        adds = "`run = mt.init()` and `run.step(step, loss=...)` add loss/lr plots, hang and NaN diagnosis, and the c/s keys"
        if self.state == "failed":  # it may call mt.init further on: the error (the reason) stopped it first
            return f"the script failed before it called mt.init (one that calls it: {adds}; docs/library.md)"
        if self.is_final:
            return f"this script reported nothing through mt: {adds} (docs/library.md)"
        return f"no step yet: the script has not called mt.init in this attempt (one that never does is still supervised; {adds}: docs/library.md)"

    def note_best(self, step: int | None, loss: float) -> None:
        """A new best loss at `step`."""
        self.best_loss, self.best_loss_step = loss, step
        self.best_history.append((step, loss))

    def roll_back_best(self, start_step: int) -> None:
        """A new attempt from `start_step`: the best is the best of the steps up to it (a killed
        attempt's later steps are gone from the run, and from its plots)."""
        while self.best_history and (self.best_history[-1][0] or 0) > start_step:
            self.best_history.pop()
        self.best_loss_step, self.best_loss = self.best_history[-1] if self.best_history else (None, None)

    def quiet_s(self, now: float) -> float | None:
        """Seconds since the newest step event when the run has stopped making progress (an open hang
        or DataLoader stall, or no step for max(hang_floor_s, hang_step_factor x the recent time
        between step events)): no rate can give an ETA then. None while it steps."""
        if self.is_final or self.supervisor_lost or not self.recent:   # a lost run says so instead
            return None
        quiet = max(0.0, now - self.recent[-1][0])
        if any(i.code in STALLED_CODES for i in self.open_incidents):
            return quiet
        if len(self.recent) < 2:
            return None
        between = (self.recent[-1][0] - self.recent[0][0]) / (len(self.recent) - 1)
        return quiet if quiet >= max(self.hang_floor_s, self.hang_step_factor * between) else None

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds to max_steps at the recent wall-clock rate; None when unknown, finished or (at
        `now`) stalled."""
        if self.is_final or self.supervisor_lost or self.step is None or not self.max_steps or len(self.recent) < 2:
            return None
        if now is not None and self.quiet_s(now) is not None:
            return None
        (t0, s0), (t1, s1) = self.recent[0], self.recent[-1]
        if s1 <= s0 or t1 <= t0:
            return None
        return max(0, self.max_steps - self.step) * (t1 - t0) / (s1 - s0)

    def failing_rank(self) -> int | None:
        """The rank that failed first: this attempt's exit incident, else the newest crash-like
        incident's evidence, else the reason."""
        inc = self.exit_incident()
        if inc is not None:
            return inc.evidence["rank"]
        for inc in reversed(self.incidents):
            if inc.code in FAILURE_CODES and isinstance(inc.evidence.get("rank"), int):
                return inc.evidence["rank"]
        m = re.search(r"rank\s*(\d+)", self.reason or self.run_end_reason or "")
        return int(m.group(1)) if m else None

    def exit_incident(self) -> IncidentLine | None:
        """The newest crash/oom/nccl_timeout incident of the current attempt that names a rank."""
        for inc in reversed(self.incidents):
            if inc.code in EXIT_CODES and isinstance(inc.evidence.get("rank"), int) and (
                    self.attempt_t is None or not inc.t or inc.t >= self.attempt_t):
                return inc
        return None

    def first_failure(self) -> str | None:
        """Why the run failed, naming the first rank to fail ("rank 1: RuntimeError: ..."): the
        exit incident's evidence (rank, line) wins over a reason written by a rank that only
        lost its peer; else the status / run_end reason."""
        inc = self.exit_incident()
        if inc is not None:
            line = inc.evidence.get("line")
            return f"rank {inc.evidence['rank']}: {line if isinstance(line, str) and line else inc.title}"
        return self.reason or self.run_end_reason

    def elapsed_s(self, now: float) -> float | None:
        if self.started is None:
            return None
        return max(0.0, (self.ended or now) - self.started)


@dataclass
class BulkResult:
    """A whole read of events.jsonl (or of its newest part) that a follower can adopt."""

    state: RunState
    series: RunSeries | None
    end: int            # events.jsonl bytes covered
    ino: int
    from_index: int     # of which came from the engine's index (the rest was scanned)


def new_state(run_dir: Path) -> RunState:
    """A blank state with what config.json and the directory name say (name, max_steps)."""
    paths = RunPaths(Path(run_dir))
    st = RunState(run_dir=paths.root, name=paths.root.name)
    cfg = read_json(paths.config)
    if isinstance(cfg, dict):
        run, train, launch, monitor = (t if isinstance(t := cfg.get(k), dict) else {} for k in ("run", "train", "launch", "monitor"))
        floor, factor = as_float(monitor.get("hang_floor_s")), as_float(monitor.get("hang_step_factor"))
        st.hang_floor_s = floor if math.isfinite(floor) and floor > 0 else st.hang_floor_s
        st.hang_step_factor = factor if math.isfinite(factor) and factor > 1 else st.hang_step_factor
        st.name = str(run.get("name") or st.name)
        script = launch.get("script")
        st.script = script if isinstance(script, str) and script else None
        if st.script is None:  # [train] is the engine's; a script says its own max_steps in run_start
            st.max_steps = as_int(train.get("max_steps"))
            clip = as_float(train.get("grad_clip"))
            st.grad_clip = clip if math.isfinite(clip) and clip > 0 else None
    return st


def reduce_rows(st: RunState, step: Sequence[float], loss: Sequence[float | None], lr: Sequence[float | None],
                grad_norm: Sequence[float | None], tokens_per_s: Sequence[float | None]) -> None:
    """Fold plain step rows, given as columns (None or NaN: unknown), into the state: the one
    step fold, which `reduce_step` (one record) and the bulk read (numpy columns) go through."""
    if not len(step):
        return
    for i in _new_bests(loss, math.inf if st.best_loss is None else st.best_loss):
        st.note_best(_row_step(step[i]), float(loss[i]))  # type: ignore[arg-type]
    st.n_steps += len(step)
    st.step = _row_step(step[-1])
    st.loss, st.lr, st.grad_norm, st.tokens_per_s = (None if v is None else float(v) for v in (
        loss[-1], lr[-1], grad_norm[-1], tokens_per_s[-1]))
    if st.state == "starting":
        st.state = "running"


def _new_bests(loss: Sequence[float | None], best: float) -> list[int]:
    """Where the loss beats `best` and every loss before it (NaN and infinities never do)."""
    if len(loss) < 64 or not hasattr(loss, "dtype"):   # a record, a few rows
        out = []
        for i, x in enumerate(loss):
            if x is not None and -math.inf < x < best:
                best = x
                out.append(i)
        return out
    import numpy as np  # a bulk read's columns only: `mt ls` never loads numpy
    finite = np.where(np.isfinite(loss), loss, np.inf)
    running = np.minimum.accumulate(np.concatenate(([best], finite)))
    return np.flatnonzero(running[1:] < running[:-1]).tolist()


def _row_step(x: float) -> int | None:
    """A column's step as a whole number (beyond float range: unknown)."""
    return x if isinstance(x, int) else int(x) if math.isfinite(x) else None


def reduce_step(st: RunState, ev: Step) -> None:
    """Fold one `step` record into the state: its row, and what only a record carries."""
    reduce_rows(st, (ev.step,), (ev.loss,), (ev.lr,), (ev.grad_norm,), (ev.tokens_per_s,))
    st.step_time_s, st.samples_per_s, st.epoch = ev.step_time_s, ev.samples_per_s, ev.epoch
    if ev.tokens_per_s is None and ev.samples_per_s is None and st.effective_batch and ev.step_time_s:
        st.samples_per_s = st.effective_batch / ev.step_time_s  # a script that counts no tokens but said its batch
    if ev.mfu is not None:
        st.mfu, st.mfu_estimated = ev.mfu, ev.flops_estimated
    if ev.t is not None:
        st.recent.append((ev.t, ev.step))


def reduce_event(st: RunState, ev: Record) -> None:
    """Fold one record of any kind into the state (unknown kinds are ignored)."""
    if ev.t is not None:
        st.last_event_t = ev.t
    if isinstance(ev, Step):
        reduce_step(st, ev)
    elif isinstance(ev, RunStart):
        if st.step != ev.start_step:  # resumed before the newest logged step: show what was logged at its own
            ck = st.last_checkpoint
            logged = ck.logged if ck is not None and ck.step == ev.start_step and ck.logged else (None, None, None)
            st.loss, st.lr, st.grad_norm = logged
            st.tokens_per_s = st.samples_per_s = st.step_time_s = st.epoch = None
        st.attempt = ev.attempt or st.attempt
        st.world_size, st.nnodes, st.effective_batch = ev.world_size, ev.nnodes, ev.effective_batch
        st.tokens_per_step, st.params_total, st.params_active = ev.tokens_per_step, ev.params_total, ev.params_active
        st.params_trainable = ev.params_trainable
        st.device, st.backend, st.precision = ev.device, ev.backend, ev.precision
        st.strategy, st.compile, st.activation_checkpointing = ev.strategy, ev.compile, ev.activation_checkpointing
        st.loss_floor = ev.data_loss_floor
        if st.script is not None:  # a script's clip and config, said at mt.init (an engine run's are its config.json's)
            st.grad_clip = ev.grad_clip or None
            config = ev.raw.get("config")
            st.args = config if isinstance(config, dict) and config else st.args
        st.max_steps = ev.max_steps or st.max_steps
        st.start_step = ev.start_step
        st.step = st.start_step if st.start_step else st.step
        st.roll_back_best(ev.start_step)
        st.run_end_status = st.run_end_reason = None
        st.attempt_t = ev.t
        st.recent.clear()
        if st.state in ("starting",) or not st.status.found:
            st.state = "running"
    elif isinstance(ev, Eval):
        st.val_loss, st.val_loss_step = ev.val_loss, ev.step
        st.evals.add(ev)
    elif isinstance(ev, Sample):
        st.evals.add(ev)
    elif isinstance(ev, Metrics) and "val_loss" in ev.values:
        st.val_loss, st.val_loss_step = ev.values["val_loss"], ev.step
    elif isinstance(ev, Checkpoint):
        st.last_checkpoint = CheckpointInfo(step=ev.step, path=ev.path, t=ev.t or 0.0, reason=ev.reason,
                                            request_id=ev.request_id, seconds=ev.seconds, blocking_s=ev.blocking_s,
                                            logged=(st.loss, st.lr, st.grad_norm) if st.step == ev.step else None)
        note_answer(st.controls, ev)
        if ev.best is not None:   # the best kept after this save, read off the manifests by the engine
            st.best_checkpoints = {int(s): v for s, v in ev.best.items() if s.isdigit()}
            st.best_metric = ev.best_metric
    elif isinstance(ev, ControlEvent):
        note_answer(st.controls, ev)
    elif isinstance(ev, RollbackEvent):
        st.rollbacks, st.rollback = max(st.rollbacks + 1, ev.count or 0), ev
    elif isinstance(ev, IncidentLine):
        add_incident(st, ev, source="engine")
    elif isinstance(ev, Knob) and ev.value is not None and ev.key != "skip_batches":  # a skip is once, not a setting
        st.knobs[ev.key] = ev.value
        st.grad_clip = (ev.value or None) if ev.key == "grad_clip" else st.grad_clip  # the grad-norm plot's clip line
    elif isinstance(ev, RunEnd):
        st.run_end_status, st.run_end_reason = ev.status, ev.reason or None
        if not st.status.found and ev.status in FINAL_STATES:
            st.state = ev.status


def cause_of(causes: dict[int, str], inc: IncidentLine) -> str | None:
    """The cause `mt replay` found for this incident: a NaN or a spike at the step it replayed to."""
    return causes.get(inc.step) if inc.code in REPLAY_CODES and inc.step is not None else None


def add_incident(st: RunState, rec: IncidentLine, source: str) -> None:
    """Open, update, merge or close an incident; the same code+step from engine and supervisor is one."""
    if rec.status == "update":  # more evidence (a capture's stacks) for the one still open
        for inc in st.incidents:
            if inc.code == rec.code and inc.status == "open":
                inc.detail, inc.evidence = rec.detail, rec.evidence
        return
    if rec.status == "closed":
        for inc in st.incidents:
            if inc.code == rec.code and inc.status == "open":
                inc.status = "closed"
        return
    for inc in st.incidents:
        # open or already closed: the other source's copy of it is not a second incident
        if inc.code == rec.code and inc.step == rec.step:
            return
    st.incidents.append(replace(rec, status="open", source=rec.source or source))  # a copy: lines stay as read


def apply_status(st: RunState, status: Status) -> bool:
    """Take state/attempt/times from status.json (the supervisor's word wins); True if changed."""
    if not status.found or status == st.status:
        return False
    st.status = status
    if status.state is not None:   # the reader keeps only RUN_STATES: anything else is not the supervisor's word
        st.state = status.state
    st.attempt = status.attempt or st.attempt
    st.started, st.ended, st.exit_code = status.started, status.ended, status.exit_code
    st.reason = status.reason or None
    return True
