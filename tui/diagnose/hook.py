"""The supervisor's side of the incident monitor: it hands the monitor a `Tick` in memory
each poll; whatever fails in there is logged, never the end of the run."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterable

from mt.contract.config import Config
from mt.contract.events import dumps
from mt.contract.records import Record
from mt.contract.status import Status


class IncidentHook:
    """The IncidentMonitor, fed in memory; its failures are logged, never fatal."""

    def __init__(self, run_dir: Path, cfg: Config, log: logging.Logger) -> None:
        self.log = log
        self.monitor: Any = None
        try:
            from tui.diagnose import monitor as incidents

            self.monitor = incidents.IncidentMonitor(run_dir, cfg.monitor, facts=incidents.facts_of(cfg))
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
        """One tick: what the supervisor knows now, passed in memory."""
        if self.monitor is None:
            return
        try:
            from tui.diagnose.monitor import Tick

            for incident in self.monitor.observe(Tick(time.time(), status, events, samples, worker_pids)):
                self.log.info("incident: %s", dumps(incident))
        except Exception:
            self.log.exception("incident monitor poll failed")
