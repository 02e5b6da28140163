"""Messages between the dashboard App (its workers: following the run, control requests) and its screen."""
from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from tui.read.watcher import WatchUpdate


@dataclass
class RunUpdated(Message):
    """The worker read something new from the run directory."""

    update: WatchUpdate


@dataclass
class ControlDone(Message):
    """A control request (checkpoint / stop / kill / resume) finished: tell the user."""

    text: str
    severity: str = "information"


@dataclass
class ControlAsked(Message):
    """The dashboard screen allowed a request that runs in a worker (kill, resume, stacks): the App starts it."""

    action: str
