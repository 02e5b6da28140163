"""[monitor] notify: the supervisor tells the user of incidents, automatic rollbacks and the run's end.

`NotifyHook.poll` runs in the supervisor's tick, after the incident monitor: it reads the new
lines of incidents.jsonl (every incident, the engine's copied there too), the events the
supervisor read (a `rollback`) and its status (a final state), makes each a `Notice`, passes it
through the rate limit and offers it to the sender's thread (tui/mirror/sender.py). Nothing here
waits on a service. Notifications write no event and no file (docs/presets.md#monitor).
"""
from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from mt.contract.config import Config
from mt.contract.events import SEVERITIES
from mt.contract.incident import IncidentLine
from mt.contract.jsonl import JsonlTail
from mt.contract.paths import RunPaths
from mt.contract.records import RecordTail, RollbackEvent, parse_incident
from mt.contract.status import CLEAN_STATES, FINAL_STATES, Status
from tui.format.fmt import fmt_best, fmt_duration, fmt_loss_cell, fmt_step
from tui.mirror.sender import Notice, Sender, instantiate

LEVEL = {"info": "info", "warn": "warning", "error": "failure"}   # an incident's severity -> apprise's type
MAX_DETAIL = 600    # characters of an incident's detail in a notice (a whole traceback is in the run directory)


@dataclass
class RateLimit:
    """At most one notice per kind per `repeat_s` and `per_minute` a minute; what it holds back is counted."""

    repeat_s: float
    per_minute: int
    last: dict[str, float] = field(default_factory=dict)     # kind -> when one last went
    recent: deque[float] = field(default_factory=deque)      # when each of the last minute's went
    held: Counter[str] = field(default_factory=Counter)      # kind -> notices held back since the last that went

    def admit(self, kind: str, now: float, repeat: bool = True) -> bool:
        """Whether a notice of `kind` may go now (noted as gone if so); `repeat` False: only the minute's cap."""
        while self.recent and now - self.recent[0] >= 60.0:
            self.recent.popleft()
        if len(self.recent) >= self.per_minute or repeat and now - self.last.get(kind, -1e18) < self.repeat_s:
            self.held[kind] += 1
            return False
        self.take(kind, now)
        return True

    def take(self, kind: str, now: float) -> None:
        self.last[kind] = now
        self.recent.append(now)

    def summary(self) -> str:
        """The line a notice that goes carries about those held back since the last one ('' if none); resets."""
        if not self.held:
            return ""
        kinds = ", ".join(f"{k} x{n}" for k, n in self.held.most_common())
        self.held.clear()
        return f"Not sent since the last notification (the rate limit, or a slow service): {kinds}."


def where(evidence: dict[str, Any]) -> str:
    """The rank and node an incident names, from its evidence ('' if none)."""
    parts = []
    rank, ranks, node = evidence.get("rank"), evidence.get("ranks"), evidence.get("node")
    if isinstance(rank, int) and not isinstance(rank, bool):
        parts.append(f"rank {rank}")
    elif isinstance(ranks, list) and ranks and all(isinstance(r, int) for r in ranks):
        parts.append("ranks " + ", ".join(map(str, ranks[:16])) + (" ..." if len(ranks) > 16 else ""))
    if isinstance(node, str) and node:
        parts.append(f"on node {node}")
    return " ".join(parts)


def incident_notice(run: str, inc: IncidentLine) -> Notice:
    """An incident as a notice: its title, then what, where, the evidence line and the advice."""
    at = f" at step {inc.step}" if inc.step is not None else ""
    head = " ".join(p for p in (f"[{inc.severity}] {inc.code}{at}", where(inc.evidence)) if p)
    detail = inc.detail if len(inc.detail) <= MAX_DETAIL else inc.detail[: MAX_DETAIL - 1] + "…"
    body = [head, detail, inc.advice and f"Advice: {inc.advice}"]
    return Notice(inc.code, f"mt {run}: {inc.title}", "\n".join(p for p in body if p), LEVEL.get(inc.severity, "info"),
                  inc.t or time.time())


def rollback_notice(run: str, raw: dict[str, Any], t: float) -> Notice:
    """A `rollback` event (an automatic one) as a notice: from where to where, what was skipped and why."""
    def val(key: str) -> str:
        v = raw.get(key)
        return "?" if v is None or isinstance(v, (dict, list)) else str(v)

    body = (f"Rolled back by {val('by')} from step {val('step')} to the checkpoint at step {val('to_step')}, "
            f"skipping {val('skip_batches')} batches, learning rate x{val('lr_scale')} "
            f"(rollback {val('count')} of this run).\nWhy: {val('why')}")
    return Notice("rollback", f"mt {run}: rolled back to step {val('to_step')}", body, "warning", t)


def end_notice(run: str, paths: RunPaths, status: Status) -> Notice:
    """The run's end; its losses are read (in the sender's thread) as `mt ls` reads them."""
    state, reason = status.state or "?", status.reason or ""
    took = fmt_duration(status.ended - status.started) if status.ended and status.started else "?"

    def build() -> tuple[str, str]:
        from tui.read.follower import load_run_state

        st = load_run_state(paths.root)
        return (f"mt {run}: {state}", f"{state} ({reason}) after {took}, step {fmt_step(st.step, st.max_steps)}\n"
                f"final loss {fmt_loss_cell(st.loss)}, best loss {fmt_best(st.best_loss, st.best_loss_step, st.best_loss_partial)}")

    return Notice("end", f"mt {run}: {state}", f"{state} ({reason}) after {took}",
                  "success" if state in CLEAN_STATES else "failure", status.ended or time.time(), build)


class NotifyHook:
    """The supervisor's notifier (node 0's only); off without [monitor] notify. Never raises, never waits."""

    def __init__(self, paths: RunPaths, cfg: Config, log: logging.Logger) -> None:
        m = cfg.monitor
        self.paths, self.log, self.run = paths.on(None), log, paths.root.name
        self.lowest = SEVERITIES.index(m.notify_severity)
        self.limit = RateLimit(m.notify_repeat_s, m.notify_per_minute)
        self.sender: Sender | None = None
        self.ended = False
        if not m.notify or cfg.launch.node_rank != 0:   # a job's other nodes: node 0 tells of the whole job
            return
        try:
            self.sender = Sender(instantiate(m.notify, str(self.paths.config)), log)
        except Exception:   # checked at launch; a resume after apprise went away runs on without it
            log.exception("notifications are off")
            return
        # incidents filed before this supervisor (an earlier attempt's) were told of by the one then
        start = JsonlTail.near_end(self.paths.incidents, 0)
        self.incidents = RecordTail(self.paths.incidents, start.offset, start.ino, parse=parse_incident)
        log.info("notifying %d services of incidents at or above %s", len(m.notify), m.notify_severity)

    def poll(self, status: Status, news: list[Any]) -> None:
        """Offer what is new: incidents just opened, automatic rollbacks, the run's end."""
        if self.sender is None:
            return
        try:
            now = time.time()
            for inc in self.incidents.iter_new():
                # a rollback's own incident: its `rollback` event is the notice (an automatic one; not the user's own)
                if inc.status == "open" and inc.code != "rolled_back" and inc.severity in SEVERITIES \
                        and SEVERITIES.index(inc.severity) >= self.lowest:
                    self._offer(incident_notice(self.run, inc), now)
            for rec in news:
                if isinstance(rec, RollbackEvent) and rec.by != "user":
                    self._offer(rollback_notice(self.run, rec.raw, rec.t or now), now, repeat=False)
            if status.state in FINAL_STATES and not self.ended:
                self.ended = True
                self.limit.take("end", now)   # the end always goes, with the count of what was held back
                self._send(end_notice(self.run, self.paths, status))
        except Exception:
            self.log.exception("notifications failed this tick")

    def _offer(self, notice: Notice, now: float, repeat: bool = True) -> None:
        if self.limit.admit(notice.kind, now, repeat):
            self._send(notice)

    def _send(self, notice: Notice) -> None:
        notice.held = self.limit.summary()
        assert self.sender is not None
        if not self.sender.offer(notice):
            self.limit.held[notice.kind] += 1

    def close(self) -> None:
        """Send what is queued for a few seconds (sender.CLOSE_WAIT_S), then let it go."""
        if self.sender is not None:
            self.sender.close()
            self.sender = None
