"""Each rank's step anatomy inside the engine: data wait, forward+backward, the step's collectives
and the optimizer, timed with no collective and no device synchronize of its own.

The loop calls `lap(mark)` at the points it passes anyway. On the CPU a mark is a clock reading.
On a GPU a mark is a CUDA event recorded on the current stream (queued, never waited on): a step's
events are read one step later, once `query()` says the stream has passed them (the step's own
read-back of its loss has made sure of that); a step whose events are not done yet is left out.
The wait in DDP's gradient all-reduce is the span from the moment the model's first parameter has
its gradient (the last one backward computes: DDP's last bucket, all-reduced after it) to the end of
backward, plus the step's agreement. It is marked by an autograd hook on that parameter, never by a
DDP comm hook: a Python comm hook runs in gloo's completion callbacks, and after a collective
timeout there it left the ranks hung instead of failing (and at exit, once, a finished rank).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from engine.dist import log
from engine.parallel import Parallel
from mt.contract.anatomy import StepAnatomy

# the marks of one step, in the order the loop passes them
MARKS = ("start", "ready", "backward", "agree_in", "agree_out", "optim")


class StepClock:
    """Times one rank's steps into `anatomy` (the heartbeat writes its medians)."""

    def __init__(self, par: Parallel, device: torch.device, anatomy: StepAnatomy) -> None:
        self.anatomy = anatomy
        self.cuda = device.type == "cuda"
        self.hooked = False
        if isinstance(par.module, torch.nn.parallel.DistributedDataParallel):
            first = next((p for p in par.module.parameters() if p.requires_grad), None)
            if first is not None:
                first.register_post_accumulate_grad_hook(self._grads_ready)
                self.hooked = True
        self._marks: dict[str, Any] = {}
        self._pending: tuple[dict[str, Any], float] | None = None  # a GPU step whose events are still queued
        self.broken = False

    def _grads_ready(self, _param: torch.Tensor) -> None:
        """The first parameter's gradient is in: backward's compute is over (the last micro-batch's wins)."""
        self.lap("ready")

    def lap(self, mark: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks[mark] = event
        else:
            self._marks[mark] = time.perf_counter()

    def end(self, data_s: float) -> None:
        """The step is over: its parts into the anatomy (on a GPU, the previous step's, if done)."""
        if self.broken:
            return
        marks, self._marks = self._marks, {}
        try:
            if not self.cuda:
                self._add(marks, data_s, lambda a, b: marks[b] - marks[a])
                return
            pending, self._pending = self._pending, (marks, data_s)
            if pending is not None and all(e.query() for e in pending[0].values()):
                ev = pending[0]
                self._add(ev, pending[1], lambda a, b: ev[a].elapsed_time(ev[b]) / 1000)
        except Exception as e:  # noqa: BLE001 - mt's measurement never ends a run
            self.broken = True
            log(f"step anatomy off: {type(e).__name__}: {e}")

    def _add(self, marks: dict[str, Any], data_s: float, span: Any) -> None:
        step_s = span("start", "optim")
        agree_s = span("agree_in", "agree_out")
        # without DDP's hook (one rank, fsdp) the all-reduce wait is not seen: compute holds it
        tail = span("ready", "backward") if "ready" in marks else 0.0
        comm_s = tail + agree_s
        compute_s = span("start", "backward") - data_s - tail
        self.anatomy.add(step_s, data_s, max(compute_s, 0.0), span("agree_out", "optim"),
                         comm_s if self.hooked else None)
