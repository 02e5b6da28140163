"""Requests from outside the run: control/*.json files (rank 0) and termination signals (all ranks)."""
from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from engine.events import CONTROL_ACTIONS


@dataclass
class Request:
    id: str
    action: str
    t: float
    path: Path


@dataclass
class Polled:
    requests: list[Request] = field(default_factory=list)
    rejected: list[tuple[str, str, str]] = field(default_factory=list)
    """(request_id, action, why) for files that are not valid requests."""


class ControlInbox:
    """Finds new request files in `control/`; handled ones move to `control/processed/`."""

    def __init__(self, control_dir: Path) -> None:
        self.dir = control_dir
        self.done_dir = control_dir / "processed"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.done_dir.mkdir(exist_ok=True)

    def poll(self) -> Polled:
        out = Polled()
        try:
            entries = [e for e in os.scandir(self.dir) if e.is_file() and e.name.endswith(".json") and not e.name.startswith(".")]
        except FileNotFoundError:
            return out
        for entry in entries:
            path = Path(entry.path)
            try:
                raw = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                out.rejected.append((path.stem, "?", f"{path.name}: not valid JSON ({e})"))
                self.done(path)
                continue
            if not isinstance(raw, dict) or raw.get("action") not in CONTROL_ACTIONS:
                action = raw.get("action") if isinstance(raw, dict) else None
                out.rejected.append((str(raw.get("id", path.stem)) if isinstance(raw, dict) else path.stem, str(action), f"{path.name}: action must be one of {', '.join(CONTROL_ACTIONS)}, got {action!r}"))
                self.done(path)
                continue
            out.requests.append(Request(str(raw.get("id", path.stem)), raw["action"], float(raw.get("t", 0.0)), path))
        out.requests.sort(key=lambda r: r.t)
        return out

    def done(self, path: Path) -> None:
        try:
            os.replace(path, self.done_dir / path.name)
        except OSError:
            pass


class StopSignals:
    """First SIGTERM/SIGINT/SIGHUP asks for a graceful stop; a second one exits at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            os._exit(128 + signum)  # second signal: the user means it; skip every cleanup
        self.received = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""
