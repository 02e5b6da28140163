"""The knobs of a running loop (`mt set`, mt/contract/knobs.py): rank 0 takes `set` requests, every
rank applies them at the same step, and the components read the values in force.

A step costs nothing while no knob changes: the agreement row carries one flag (engine/consensus.py),
and the settings travel only on a step whose flag is up, in one broadcast on the host group."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from engine.dist import DistEnv, log
from mt.contract import builders as event_fields
from mt.contract.config import Config
from mt.contract.inbox import ControlInbox, Request
from mt.contract.knobs import ONCE, SPECS, Knobs

TAKES = tuple(SPECS)
"""The knobs mt's engine takes: every one (a run_start's `knobs`)."""


@dataclass
class Turned:
    """What a step's settings changed: the batches to skip once (the lasting knobs are in the tuner's Knobs)."""

    skip_batches: int = 0
    lines: list[str] = field(default_factory=list)


class Tuner:
    """Holds the run's knobs and pushes the values in force into the components that use them."""

    def __init__(self, knobs: Knobs, cfg: Config, env: DistEnv, events: Any, inbox: ControlInbox | None, *,
                 precision: Any, evaluator: Any, checkpointer: Any, step_rules: Any) -> None:
        self.knobs, self.cfg, self.env, self.events, self.inbox = knobs, cfg, env, events, inbox
        # the components that read a knob each step (step_rules: rank 0's, else None)
        self.precision, self.evaluator, self.checkpointer, self.step_rules = precision, evaluator, checkpointer, step_rules
        self.pending: list[Request] = []  # rank 0: `set` requests taken this step, applied after it
        self.log_every = cfg.train.log_every
        self.install()

    @property
    def asked(self) -> bool:
        """Rank 0 holds settings to apply after this step (the agreement's flag)."""
        return bool(self.pending)

    def value(self, key: str) -> float | int:
        """The value in force of a lasting knob: the turned one, else the preset's."""
        turned = getattr(self.knobs, key)
        if turned is not None:
            return turned
        t = self.cfg.train
        return {"grad_clip": t.grad_clip, "eval_every": t.eval_every, "log_every": t.log_every,
                "checkpoint_every": self.cfg.checkpoint.every_steps}[key]

    def install(self) -> None:
        """The values in force, into the components that read them each step."""
        clip = float(self.value("grad_clip"))
        self.precision.grad_clip = clip
        self.evaluator.every = int(self.value("eval_every"))
        self.checkpointer.every = int(self.value("checkpoint_every"))
        if self.step_rules is not None:
            self.step_rules.grad_clip = clip
        self.log_every = int(self.value("log_every"))

    def apply(self, step: int) -> Turned:
        """Collective, on a step whose agreement says a knob changed: rank 0's settings reach every
        rank and hold from step + 1; each change is a `knob` event and each request is answered."""
        box: list[Any] = [[(r.id, r.settings) for r in self.pending]]
        if self.env.world_size > 1:
            dist.broadcast_object_list(box, src=0, group=self.env.host_group)  # the host: a few bytes, no device
        turned = Turned()
        for rid, settings in box[0]:
            for key, value in settings.items():
                previous = None if key in ONCE else self.value(key)
                if key in ONCE:
                    turned.skip_batches += int(value)
                else:
                    self.knobs.set(key, value)
                self.events.emit("knob", step=step + 1, key=key, value=value, previous=previous, by="user", request=rid)
                turned.lines.append(f"{key}={value:g}")
        self.install()
        log(f"knobs from step {step + 1}: {', '.join(turned.lines)}")  # every rank: each says the same step
        for req in self.pending:
            what = ", ".join(f"{k}={v:g}" for k, v in req.settings.items())
            self._answer(req, "done", f"applied from step {step + 1}: {what}")
        self.pending = []
        return turned

    def reject_pending(self, why: str) -> None:
        """Requests the run ends before applying (rank 0)."""
        for req in self.pending:
            self._answer(req, "rejected", why)
        self.pending = []

    def _answer(self, req: Request, status: str, detail: str) -> None:
        self.events.emit("control", **event_fields.control_answer(req.id, req.action, status, detail))
        if self.inbox is not None:
            self.inbox.done(req.path)
