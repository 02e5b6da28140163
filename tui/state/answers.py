"""The engine's answers to control requests, folded from events: the viewer's and `mt ckpt`'s."""
from __future__ import annotations

from dataclasses import dataclass

from mt.contract.records import Checkpoint, ControlEvent, Record

ANSWERED = ("done", "rejected")


@dataclass
class ControlAnswer:
    """One request's answer: status is the newest its control events gave (accepted, done,
    rejected); `wait_answer` says timeout or ended when neither done nor rejected came."""

    request_id: str
    action: str = ""
    status: str = ""
    detail: str = ""
    checkpoint: Checkpoint | None = None
    """The `checkpoint` event written for this request (checkpoint action), if any."""

    @property
    def answered(self) -> bool:
        return self.status in ANSWERED

    @property
    def complete(self) -> bool:
        """Rejected, or done with everything it promised (a checkpoint request: its checkpoint)."""
        return self.status == "rejected" or (
            self.status == "done" and (self.action != "checkpoint" or self.checkpoint is not None))


def note_answer(answers: dict[str, ControlAnswer], ev: Record, only: str | None = None) -> None:
    """Fold one event into the answers it concerns (`only`: just that request's)."""
    if isinstance(ev, Checkpoint):
        ids = ev.request_ids
    elif isinstance(ev, ControlEvent):
        ids = [ev.request_id]
    else:
        return
    for rid in ids:
        if only is not None and rid != only:
            continue
        answer = answers.setdefault(rid, ControlAnswer(rid))
        if isinstance(ev, Checkpoint):
            answer.checkpoint = ev
        elif isinstance(ev, ControlEvent):
            answer.action = ev.action or answer.action
            answer.status, answer.detail = ev.status, ev.detail
