"""The supervisor's side of the incident monitor: it hands the monitor a `Tick` in memory
each poll; whatever fails in there is logged, never the end of the run."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Iterable

from mt.contract.config import Config
from mt.contract.events import dumps
from mt.contract.records import Record
from mt.contract.status import Status

STACKS_WAIT_S = 30.0   # how long an overdue incident waits for its capture before its attempt is ended anyway


class IncidentHook:
    """The IncidentMonitor, fed in memory; its failures are logged, never fatal."""

    def __init__(self, run_dir: Path, cfg: Config, log: logging.Logger, node: str | None = None,
                 rules: bool = True, job: Any = None) -> None:
        """`rules` False: a job's node that is not the job's own: no rules (the job's supervisor runs
        them over every node), but it still answers stacks requests for its ranks. `job`: the
        supervisor's JobReader, shared with its peer watch (each node read once a tick)."""
        self.log = log
        self.run_dir = Path(run_dir)
        self.monitor: Any = None
        self.captures: Any = None
        self.flight: list[Any] = []   # flight-recorder reports waiting for an incident to join
        try:
            from tui.diagnose import monitor as incidents

            if rules:
                self.monitor = incidents.IncidentMonitor(run_dir, cfg.monitor, facts=incidents.facts_of(cfg), node=node,
                                                          job=job)
            from mt.contract.paths import RunPaths
            from tui.stacks.auto import IncidentCaptures
            from tui.stacks.recorder import dumps_here

            # the supervisor gives its workers worker_env(os.environ): the same choice as theirs
            flight = dumps_here(cfg, RunPaths(self.run_dir, node).flight, dict(os.environ))
            self.captures = IncidentCaptures(self.run_dir, log, node=node, flight=flight)
        except (ImportError, AttributeError) as e:
            log.info("incident rules not available (%s); running without them", e)
        except Exception:
            log.exception("incident monitor failed to start")

    def catch_up(self, history: Iterable[Record]) -> None:
        """The run's earlier events (a resume), before the first tick."""
        try:
            if self.monitor is not None:
                self.monitor.catch_up(history)
        except Exception:
            self.log.exception("incident monitor failed to read the run's history")
        for _ in history:  # whatever it did not take: the tail must end up at the end of the file
            pass

    def poll(self, status: Status, events: list[Record], samples: list[dict[str, Any]],
             worker_pids: dict[int, int]) -> None:
        """One tick: what the supervisor knows now, passed in memory (the other nodes' files the
        monitor reads through the job's reader)."""
        if self.monitor is None:
            self._captured()
            return
        try:
            from tui.diagnose.monitor import Tick

            tick = Tick(time.time(), status, events, samples, worker_pids)
            for incident in self.monitor.observe(tick):
                self.log.info("incident: %s", dumps(incident))
                if incident.get("status") == "open" and self.captures is not None:
                    self.captures.opened(incident["code"])
        except Exception:
            self.log.exception("incident monitor poll failed")
        self._captured()

    def overdue(self, code: str, since: float, age_s: float, now: float) -> dict[str, Any] | None:
        """The open incident `code` opened at or after `since`, once `age_s` old and its stacks are
        back (or STACKS_WAIT_S later without them): what the supervisor ends a hung attempt on."""
        rec = self.monitor.open.get(code) if self.monitor is not None and age_s > 0 else None
        t = rec.get("t") if rec is not None else None
        if not isinstance(t, (int, float)) or t < since or now - t < age_s:
            return None
        ev = rec.get("evidence") or {}   # type: ignore[union-attr]
        captured = "verdict" in ev or "stacks_error" in ev or self.captures is None
        return rec if captured or now - t >= age_s + STACKS_WAIT_S else None

    def note(self, finding: Any, closed_reason: str) -> None:
        """Record an incident about what is already over (opened and closed at once)."""
        try:
            if self.monitor is not None:
                for rec in self.monitor.note(finding, time.time(), closed_reason):
                    self.log.info("incident: %s", dumps(rec))
        except Exception:
            self.log.exception("incident note failed")

    def _captured(self) -> None:
        """The stacks captured for open incidents, each written as an update of its incident."""
        if self.captures is None:
            return
        if self.monitor is None:  # no incident to update: only keep answering requests
            try:
                self.captures.take()
                self.captures.take_flight()
            except Exception:
                self.log.exception("stacks requests failed")
            return
        try:
            from tui.stacks.auto import detail_of, evidence_of

            self.flight += [d.flight for d in self.captures.take_flight()]
            self._flight()
            for done in self.captures.take():
                if done.capture is None:
                    rec = self.monitor.update(done.code, {"stacks_error": done.error}, f"no stacks: {done.error}")
                else:
                    rec = self.monitor.update(done.code, evidence_of(done.capture, self.run_dir, done.nodes),
                                              detail_of(done.capture, done.nodes))
                if rec is not None:
                    self.log.info("incident stacks: %s", dumps(rec))
        except Exception:
            self.log.exception("incident stacks update failed")

    def _flight(self) -> None:
        """Each flight-recorder report joins the open incident it explains (an NCCL timeout, a hang, else
        any), once one is open: torch dumps before the watchdog ends the ranks, the exit rule opens after."""
        code = next((c for c in ("nccl_timeout", "hang", *self.monitor.open) if c in self.monitor.open), None)
        if code is None or not self.flight:
            return
        from tui.stacks.auto import flight_evidence

        for report in self.flight:
            rec = self.monitor.update(code, flight_evidence(report, self.run_dir), report.line())
            if rec is not None:
                self.log.info("incident flight recorder: %s", dumps(rec))
        self.flight = []
