"""The dashboard's control policy, without Textual: which requests the run's state allows, which
requests this viewer sent, and what to tell the user of the engine's answers to them."""
from __future__ import annotations

from dataclasses import dataclass, field

from mt.contract.records import Checkpoint, ControlEvent, Record
from mt.contract.status import FINAL_STATES

RESUMABLE = ("stopped", "failed", "killed")


@dataclass(frozen=True)
class Note:
    """One thing to tell the user (a toast)."""

    text: str
    severity: str = "information"
    title: str = ""


def refusal(action: str, state: str, supervisor_lost: bool = False) -> Note | None:
    """Why `action` (checkpoint, stop, kill, resume, stacks) cannot be asked of a run in `state`;
    None: it can."""
    if action == "resume":
        if state in RESUMABLE or supervisor_lost:
            return None
        return Note(f"the run is {state}: only a stopped, failed or killed run can be resumed", "warning")
    if state in FINAL_STATES:
        what = "no rank to capture" if action == "stacks" else f"nothing to {action}"
        return Note(f"the run is {state}: {what}", "warning")
    if state == "stopping" and action in ("checkpoint", "stop", "set"):
        return Note(f"the run is already stopping: cannot {action}", "warning")
    return None


@dataclass
class RequestBook:
    """The requests this viewer sent, and those still waiting for the engine's answer."""

    pending: dict[str, str] = field(default_factory=dict)       # request id -> action
    sent: list[tuple[str, str]] = field(default_factory=list)   # (request id, action), oldest first

    def add(self, request_id: str, action: str) -> None:
        self.pending[request_id] = action
        self.sent.append((request_id, action))

    def answer(self, ev: Record) -> Note | None:
        """What to tell the user of `ev` when it answers one of our requests (None: not ours, or nothing to say)."""
        asked = [rid for rid in ev.request_ids if rid in self.pending] if isinstance(ev, Checkpoint) else []
        if asked:
            # its `control done` may come before or after it: this is the answer that counts
            for rid in asked:
                self.pending.pop(rid, None)
            return Note(f"checkpoint saved at step {ev.step}", title="checkpoint")
        if not isinstance(ev, ControlEvent) or ev.request_id not in self.pending:
            return None
        if ev.status == "rejected":
            self.pending.pop(ev.request_id, None)
            return Note(f"{ev.action} rejected: {ev.detail}", "error")
        if ev.status == "accepted" and ev.action == "stop":
            return Note("stop accepted: final checkpoint, then the ranks exit")
        if ev.status == "done" and ev.action == "set":
            self.pending.pop(ev.request_id, None)
            return Note(f"set {ev.detail}", title="knobs")
        if ev.status == "done" and ev.action != "checkpoint":
            self.pending.pop(ev.request_id, None)
        return None
