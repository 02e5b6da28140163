"""Reduce a run directory (events.jsonl, status.json, incidents.jsonl) into a `RunState`.

Pure logic, no Textual: `RunFollower.poll()` reads only the bytes appended since the last
call; `load_run_state()` is the one-shot read used by `mt ls` / `mt watch --once`.
"""
from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mt.events import FINAL_STATES, as_float
from mt.jsonl import read_json
from mt.paths import RunPaths, checkpoint_dirs

if TYPE_CHECKING:
    from tui.state.series import Series


def _series() -> "Series":
    # imported here: a Series loads numpy with its first point, which `mt ls` never pays for
    from tui.state.series import Series
    return Series()


@dataclass
class CheckpointInfo:
    """The newest checkpoint the engine reported."""

    step: int
    path: str
    t: float
    reason: str = ""
    request_id: str | None = None

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.t)


@dataclass
class Incident:
    """One diagnosed incident (from an `incident` event or a line of incidents.jsonl)."""

    code: str
    severity: str
    step: int | None
    title: str
    detail: str = ""
    advice: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    t: float = 0.0
    status: str = "open"
    source: str = "engine"


@dataclass
class ControlAnswer:
    """The engine's latest answer to a control request, and the checkpoint it produced."""

    request_id: str
    action: str
    status: str
    detail: str = ""
    checkpoint_step: int | None = None


@dataclass
class RunSeries:
    """Full plot history of a run, x = optimizer step."""

    loss: "Series" = field(default_factory=_series)
    val_loss: "Series" = field(default_factory=_series)
    lr: "Series" = field(default_factory=_series)
    grad_norm: "Series" = field(default_factory=_series)
    tokens_per_s: "Series" = field(default_factory=_series)

    def all(self) -> dict[str, "Series"]:
        return {"loss": self.loss, "val_loss": self.val_loss, "lr": self.lr, "grad_norm": self.grad_norm,
                "tokens_per_s": self.tokens_per_s}

    def truncate_after(self, step: float) -> None:
        for s in self.all().values():
            s.truncate_after(step)

    def replace(self, other: "RunSeries") -> None:
        for name, s in self.all().items():
            s.replace(other.all()[name])

    def add_step(self, ev: dict[str, Any]) -> None:
        x = _plot_x(ev.get("step"))
        if x is None:
            return      # no usable step: nowhere to draw it (the reducer still counts it)
        self.loss.append(x, as_float(ev.get("loss")))
        self.lr.append(x, as_float(ev.get("lr")))
        self.grad_norm.append(x, as_float(ev.get("grad_norm")))
        self.tokens_per_s.append(x, as_float(ev.get("tokens_per_s")))

    def add_event(self, ev: dict[str, Any]) -> None:
        """A non-step event: a new attempt drops what followed its checkpoint; an eval adds a point."""
        kind = ev.get("kind")
        if kind == "run_start":
            self.truncate_after(_plot_x(ev.get("start_step")) or 0.0)
        elif kind == "eval":
            x = _plot_x(ev.get("step"))
            if x is not None:
                self.val_loss.append(x, as_float(ev.get("val_loss")))


def _plot_x(v: Any) -> float | None:
    """An event's step as a plot x: finite, else None."""
    x = as_float(v)
    return x if math.isfinite(x) else None


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
    val_loss: float | None = None
    val_loss_step: int | None = None
    lr: float | None = None
    grad_norm: float | None = None
    grad_clip: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    world_size: int | None = None
    nnodes: int | None = None
    device: str | None = None
    backend: str | None = None
    precision: str | None = None
    effective_batch: int | None = None
    tokens_per_step: int | None = None
    params_total: int | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None          # status.json reason, else run_end reason
    run_end_status: str | None = None
    run_end_reason: str | None = None
    last_event_t: float | None = None
    last_checkpoint: CheckpointInfo | None = None
    incidents: list[Incident] = field(default_factory=list)
    controls: dict[str, ControlAnswer] = field(default_factory=dict)
    bad_lines: int = 0
    supervisor_lost: bool = False      # status says live but its supervisor process is gone
    n_steps: int = 0                   # step events seen (all attempts)
    status: dict[str, Any] = field(default_factory=dict, repr=False)
    # (t, step) of recent step events, for a wall-clock ETA that includes eval/ckpt pauses
    recent: deque = field(default_factory=lambda: deque(maxlen=64), repr=False)

    @property
    def open_incidents(self) -> list[Incident]:
        return [i for i in self.incidents if i.status == "open"]

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    def eta_s(self) -> float | None:
        """Seconds to max_steps at the recent wall-clock rate; None when unknown or finished."""
        if self.is_final or self.step is None or not self.max_steps or len(self.recent) < 2:
            return None
        (t0, s0), (t1, s1) = self.recent[0], self.recent[-1]
        if s1 <= s0 or t1 <= t0:
            return None
        return max(0, self.max_steps - self.step) * (t1 - t0) / (s1 - s0)

    def failing_rank(self) -> int | None:
        """The rank that failed first: the newest crash-like incident's evidence, else the reason."""
        for inc in reversed(self.incidents):
            if inc.code in ("crash", "oom", "nccl_timeout", "hang") and isinstance(inc.evidence.get("rank"), int):
                return inc.evidence["rank"]
        m = re.search(r"rank\s*(\d+)", self.reason or self.run_end_reason or "")
        return int(m.group(1)) if m else None

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
    from_cache: int     # of which came from an index or cache
    cached: bool        # a cache was written


def newest_checkpoint_dir(paths: RunPaths) -> CheckpointInfo | None:
    """The newest `step-<S>` folder on disk (for a quick read that saw no checkpoint event)."""
    found = checkpoint_dirs(paths.checkpoints)
    if not found:
        return None
    step, folder = found[0]
    try:
        return CheckpointInfo(step=step, path=str(folder), t=folder.stat().st_mtime, reason="")
    except OSError:
        return None


def new_state(run_dir: Path) -> RunState:
    """A blank state with what config.json and the directory name say (name, max_steps)."""
    paths = RunPaths(Path(run_dir))
    st = RunState(run_dir=paths.root, name=paths.root.name)
    cfg = read_json(paths.config)
    if isinstance(cfg, dict):
        run, train = cfg.get("run") or {}, cfg.get("train") or {}
        st.name = str(run.get("name") or st.name)
        st.max_steps = _int(train.get("max_steps"))
        clip = as_float(train.get("grad_clip"))
        st.grad_clip = clip if math.isfinite(clip) and clip > 0 else None
    return st


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v                # even one beyond float range (a line from elsewhere)
    return int(v) if isinstance(v, float) and math.isfinite(v) else None


def _num(v: Any) -> float | None:
    return None if v is None else as_float(v)


def reduce_step(st: RunState, ev: dict[str, Any]) -> None:
    """Fold one `step` event into the state."""
    step = _int(ev.get("step"))
    st.step = step
    st.n_steps += 1
    loss = _num(ev.get("loss"))
    st.loss = loss
    if loss is not None and math.isfinite(loss) and (st.best_loss is None or loss < st.best_loss):
        st.best_loss, st.best_loss_step = loss, step
    st.lr = _num(ev.get("lr"))
    st.grad_norm = _num(ev.get("grad_norm"))
    st.tokens_per_s = _num(ev.get("tokens_per_s"))
    st.step_time_s = _num(ev.get("step_time_s"))
    if "mfu" in ev:
        st.mfu = _num(ev.get("mfu"))
    t = _num(ev.get("t"))
    if t is not None and step is not None:
        st.recent.append((t, step))
    if st.state == "starting":
        st.state = "running"


def reduce_event(st: RunState, ev: dict[str, Any]) -> None:
    """Fold one event of any kind into the state (unknown kinds are ignored)."""
    kind = ev.get("kind")
    t = _num(ev.get("t"))
    if t is not None and math.isfinite(t):
        st.last_event_t = t
    if kind == "step":
        reduce_step(st, ev)
    elif kind == "run_start":
        st.attempt = _int(ev.get("attempt")) or st.attempt
        for key in ("world_size", "nnodes", "effective_batch", "tokens_per_step", "params_total"):
            setattr(st, key, _int(ev.get(key)))
        st.device, st.backend, st.precision = ev.get("device"), ev.get("backend"), ev.get("precision")
        st.max_steps = _int(ev.get("max_steps")) or st.max_steps
        st.start_step = _int(ev.get("start_step")) or 0
        st.step = st.start_step if st.start_step else st.step
        st.run_end_status = st.run_end_reason = None
        st.recent.clear()
        if st.state in ("starting",) or not st.status:
            st.state = "running"
    elif kind == "eval":
        st.val_loss, st.val_loss_step = _num(ev.get("val_loss")), _int(ev.get("step"))
    elif kind == "checkpoint":
        st.last_checkpoint = CheckpointInfo(
            step=_int(ev.get("step")) or 0, path=str(ev.get("path") or ""), t=t or 0.0,
            reason=str(ev.get("reason") or ""), request_id=ev.get("request_id"))
        rid = ev.get("request_id")
        if rid and rid in st.controls:
            st.controls[rid].checkpoint_step = st.last_checkpoint.step
    elif kind == "control":
        rid = str(ev.get("request_id") or "")
        prev = st.controls.get(rid)
        st.controls[rid] = ControlAnswer(
            request_id=rid, action=str(ev.get("action") or ""), status=str(ev.get("status") or ""),
            detail=str(ev.get("detail") or ""), checkpoint_step=prev.checkpoint_step if prev else None)
    elif kind == "incident":
        add_incident(st, ev, source="engine")
    elif kind == "run_end":
        st.run_end_status, st.run_end_reason = ev.get("status"), ev.get("reason")
        if not st.status and st.run_end_status in FINAL_STATES:
            st.state = str(st.run_end_status)


def add_incident(st: RunState, rec: dict[str, Any], source: str) -> None:
    """Open, merge or close an incident; the same code+step from engine and supervisor is one."""
    code = str(rec.get("code") or "unknown")
    status = str(rec.get("status") or "open")
    step = _int(rec.get("step"))
    if status == "closed":
        for inc in st.incidents:
            if inc.code == code and inc.status == "open":
                inc.status = "closed"
        return
    for inc in st.incidents:
        if inc.code == code and inc.step == step and inc.status == "open":
            return
    ev = rec.get("evidence")
    st.incidents.append(Incident(
        code=code, severity=str(rec.get("severity") or "info"), step=step,
        title=str(rec.get("title") or code), detail=str(rec.get("detail") or ""),
        advice=str(rec.get("advice") or ""), evidence=ev if isinstance(ev, dict) else {},
        t=_num(rec.get("t")) or 0.0, status="open", source=str(rec.get("source") or source)))


def apply_status(st: RunState, status: Any) -> bool:
    """Take state/attempt/times from status.json (the supervisor's word wins); True if changed."""
    if not isinstance(status, dict) or status == st.status:
        return False
    st.status = status
    if status.get("state"):
        st.state = str(status["state"])
    st.attempt = _int(status.get("attempt")) or st.attempt
    st.started = _num(status.get("started"))
    st.ended = _num(status.get("ended"))
    st.exit_code = _int(status.get("exit_code"))
    st.reason = status.get("reason") or None
    return True

