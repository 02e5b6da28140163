"""Requests from outside the run: control/*.json files (rank 0) and termination signals (all ranks)."""
from __future__ import annotations

import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from mt.contract import door
from mt.contract.events import CONTROL_ACTIONS
from mt.contract.knobs import KnobError, check


@dataclass
class Request:
    id: str
    action: str
    t: float
    path: Path
    settings: dict[str, float | int] = field(default_factory=dict)
    """`set`: the knobs it turns, each checked (mt/contract/knobs.py)."""


@dataclass
class Polled:
    requests: list[Request] = field(default_factory=list)
    rejected: list[tuple[str, str, str]] = field(default_factory=list)
    """(request_id, action, why) for files that are not valid requests."""


class ControlInbox:
    """Finds new request files in `control/`; handled and rejected entries move to `control/processed/`.

    Nothing an outsider puts in `control/` may end a run: every entry is either a valid
    request or a counted rejection that leaves the inbox.
    """

    KEEP_PROCESSED = 256  # handled requests kept for inspection; older ones are deleted
    MAX_BYTES = 64 * 1024  # a real request is ~100 bytes

    def __init__(self, control_dir: Path) -> None:
        self.dir = control_dir
        self.done_dir = control_dir / "processed"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.done_dir.mkdir(exist_ok=True)
        self._stuck: set[str] = set()  # entries that could not be moved: rejected once, then ignored
        # requests already returned, which stay in control/ until `done` moves them (a script's save
        # may take many polls): each is returned once, or one request would be accepted and saved again
        self._taken: set[str] = set()

    def poll(self, refuse: dict[str, str] | None = None) -> Polled:
        """New requests, oldest first; `refuse`: actions this reader cannot take -> why (rejected, moved out)."""
        out = Polled()
        try:
            entries = [e for e in os.scandir(self.dir)
                       if not e.name.startswith(".") and e.path != str(self.done_dir) and e.name not in self._stuck]
        except OSError:
            return out
        self._taken.intersection_update(e.name for e in entries)  # moved by `done`: a later file of that name is new
        for entry in entries:
            if entry.name in self._taken:
                continue
            path = Path(entry.path)
            raw, why = _read_request(path, self.MAX_BYTES)
            req = _parse_request(raw, path) if why is None else None
            if isinstance(req, str):
                why, req = req, None
            elif refuse and req is not None and req.action in refuse:
                why, req = refuse[req.action], None
            if req is None:
                rid = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else path.stem
                action = raw.get("action") if isinstance(raw, dict) else None
                out.rejected.append((rid[:128], str(action)[:64], f"{path.name}: {why}"))
                self._move(path)
                continue
            self._taken.add(entry.name)
            out.requests.append(req)
        if out.rejected:
            self._prune_processed()  # once a poll, however many entries a flood brought
        out.requests.sort(key=lambda r: r.t)
        return out

    def done(self, path: Path) -> None:
        """Move an answered request out of the inbox."""
        if self._move(path):
            self._prune_processed()

    def _move(self, path: Path) -> bool:
        """Move an entry (the entry itself: a symlink is never followed) into processed/."""
        dest = self.done_dir / path.name
        if os.path.lexists(dest):
            dest = self.done_dir / f"{path.name}.{time.time_ns()}"
        try:
            os.rename(path, dest)
        except OSError:
            self._stuck.add(path.name)
            return False
        return True

    def _prune_processed(self) -> None:
        try:
            entries = sorted(os.scandir(self.done_dir), key=lambda e: e.stat(follow_symlinks=False).st_mtime)
        except OSError:
            return
        for entry in entries[:max(0, len(entries) - self.KEEP_PROCESSED)]:
            try:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


def _read_request(path: Path, max_bytes: int) -> tuple[Any, str | None]:
    """The JSON in a regular file at `path`, through the door (never a link, a FIFO, a device)."""
    if not path.name.endswith(".json"):
        return None, "a request file's name ends in .json"
    return door.read_json_why(path, max_bytes)


def _parse_request(raw: Any, path: Path) -> Request | str:
    """A Request, or why `raw` is not one."""
    if not isinstance(raw, dict):
        return f"a request is a JSON object, got {type(raw).__name__}"
    action = raw.get("action")
    if action not in CONTROL_ACTIONS:
        return f"action must be one of {', '.join(CONTROL_ACTIONS)}, got {str(action)[:64]!r}"
    rid = raw.get("id", path.stem)
    if not isinstance(rid, str) or not rid or len(rid) > 128:
        return "id must be a string of 1-128 characters"
    t = raw.get("t", 0.0)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return f"t must be a number (seconds since the epoch), got {str(t)[:64]!r}"
    settings = _settings(raw.get("settings")) if action == "set" else {}
    if isinstance(settings, str):
        return settings
    return Request(rid, action, float(t), path, settings)


def _settings(raw: Any) -> dict[str, float | int] | str:
    """A `set` request's knobs, each checked, or why they are not knobs."""
    if not isinstance(raw, dict) or not raw:
        return "a set request carries settings: a JSON object of knob -> value"
    try:
        return {str(key): check(str(key), value) for key, value in raw.items()}
    except KnobError as e:
        return str(e)


class StopSignals:
    """First SIGTERM/SIGINT/SIGHUP asks for a graceful stop; a second one, SAME_STOP_S later or more, exits at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    # Slurm signals every process of a step: a rank gets a cancel's SIGTERM from Slurm and again from
    # torchrun forwarding it, moments apart; that repeat is the same stop (the supervisor, under
    # Slurm, no longer forwards it: tui/supervise/supervisor.py `_on_stop`; torchrun's agent always does)
    SAME_STOP_S = 0.2

    def __init__(self, signals: tuple[int, ...] = SIGNALS) -> None:
        self.received: int | None = None
        self.received_at = 0.0
        self.signals = signals

    def install(self) -> None:
        for sig in self.signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            if time.monotonic() - self.received_at < self.SAME_STOP_S:
                return
            os._exit(128 + signum)  # second signal: the user means it; skip every cleanup
        self.received, self.received_at = signum, time.monotonic()

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""
