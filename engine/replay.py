"""`python -m engine --run-dir RUN/replay/step-S --replay-to S`: a run's steps again, from the checkpoint
`mt replay` put in that folder to step S, with hooks on every module (tui/supervise/replay.py starts it).

Every module's forward output and the gradient at that output (a tensor hook) are measured: the
largest magnitude (non-finite if any element is) and the norm. The loop is the run's own (`Trainer`),
so the replay computes what the run computed; only saving is off and it ends after step S.
Rank 0 writes findings.json: the first non-finite value in execution order (forward, the loss, then
backward) or, without one, the module whose norm at S jumped most against its median before S.
"""
from __future__ import annotations

import math
import statistics
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.train import Trainer
from mt.contract.jsonl import write_json_atomic

ROOT = "(model)"
"""The name the whole model goes by (its qualified name is empty)."""
LOSS = "(loss)"
"""The loss given to backward: non-finite there and nowhere before means the loss itself (or a fault on it) broke."""
FINDINGS = "findings.json"


@dataclass
class Hit:
    """One measured value: where (step, rank, micro-batch, phase, order in execution) and what."""

    step: int
    rank: int
    micro: int
    phase: str  # forward | loss | backward
    order: int
    module: str
    amax: float
    norm: float

    @property
    def finite(self) -> bool:
        """Every element finite: the largest magnitude says it (a norm of finite values may overflow)."""
        return math.isfinite(self.amax)


@dataclass
class Jump:
    """A module's norm at the target step against its own median over the replayed steps before it."""

    module: str
    phase: str
    rank: int
    micro: int
    value: float
    median: float
    ratio: float


def _tensors(output: Any) -> list[torch.Tensor]:
    """The floating-point tensors a module returned (itself, or the first level of a tuple, list or mapping)."""
    items = output.values() if isinstance(output, Mapping) else output if isinstance(output, (tuple, list)) else [output]
    return [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0]


@dataclass
class Recorder:
    """The hooks of one rank: each value measured on the device, read back once per step (`flush`)."""

    rank: int
    step: int = 0
    micro: int = -1
    phase: str = "forward"
    active: bool = False
    order: int = 0
    pending: list[tuple[int, str, int, str, torch.Tensor]] = field(default_factory=list)
    first: Hit | None = None
    norms: dict[tuple[str, str], dict[int, tuple[float, int]]] = field(default_factory=dict)  # (module, phase) -> step -> (max norm, its micro)
    indices: dict[int, dict[int, list[int]]] = field(default_factory=dict)  # step -> micro -> dataset indices
    losses: dict[int, float] = field(default_factory=dict)
    measured: dict[int, tuple[weakref.ref, torch.Tensor]] = field(default_factory=dict)  # this micro-batch's, by id

    def install(self, model: nn.Module) -> None:
        for name, module in model.named_modules():
            module.register_forward_hook(partial(self._forward, name or ROOT))

    def batches(self, source: Iterator[Any]) -> Iterator[Any]:
        """The loop's batches, each one marking the next micro-batch and keeping its dataset indices."""
        for batch, idx in source:
            self.micro += 1
            self.phase = "forward"
            self.measured.clear()
            self.indices.setdefault(self.step, {})[self.micro] = [int(i) for i in idx]
            yield batch, idx

    def begin(self, step: int) -> None:
        self.flush()
        self.step, self.micro, self.order, self.active = step, -1, 0, True
        self.measured.clear()

    def loss(self, loss: torch.Tensor) -> None:
        """The loss as backward receives it: after it, hooks measure gradients (a recomputed forward is skipped)."""
        if self.active:
            self._note("loss", LOSS, loss.detach().reshape(1))
        self.phase = "backward"

    def _forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if not self.active or self.phase != "forward" or not torch.is_grad_enabled():
            return  # eval, or activation checkpointing's recompute in backward
        for t in _tensors(output):
            self._note("forward", name, t)
            if t.requires_grad:
                t.register_hook(partial(self._grad, name))

    def _grad(self, name: str, grad: torch.Tensor) -> None:
        if self.active and grad.numel() > 0:
            self._note("backward", name, grad)

    def _note(self, phase: str, name: str, t: torch.Tensor) -> None:
        # measured on the device and read back at the step's end: no sync per hook
        self.pending.append((self.micro, phase, self.order, name, self._measure(t)))
        self.order += 1

    def _measure(self, t: torch.Tensor) -> torch.Tensor:
        """(min, max, norm) of a tensor, on its device: once for a tensor a parent returns as its child
        gave it (MLP -> its dropout's output), and for the gradient both their hooks receive."""
        seen = self.measured.get(id(t))
        if seen is not None and seen[0]() is t:
            return seen[1]
        # min and max in one pass (NaN if any element is) say finite or not; the norm, for a spike, may
        # overflow on finite values near the dtype's limit: then it is left out. Both are plain passes over
        # memory (abs().amax() copies, the inf-norm is ~20x slower on CPU: bench/replay_cause.py --hooks)
        d = t.detach()
        low, high = torch.aminmax(d)
        stats = torch.stack([low.float(), high.float(), torch.linalg.vector_norm(d, dtype=torch.float32)])
        self.measured[id(t)] = (weakref.ref(t), stats)
        return stats

    def flush(self) -> None:
        """Read this step's values back (one transfer) into the first non-finite hit and the norms."""
        if not self.pending:
            return
        values = torch.stack([v for *_, v in self.pending]).cpu().tolist()
        for (micro, phase, order, name, _), (low, high, norm) in zip(self.pending, values):
            amax = math.nan if math.isnan(low) or math.isnan(high) else max(abs(low), abs(high))
            hit = Hit(self.step, self.rank, micro, phase, order, name, amax, norm)
            if not hit.finite:
                if self.first is None:
                    self.first = hit
                continue
            seen = self.norms.setdefault((name, phase), {})
            if math.isfinite(norm) and norm > seen.get(self.step, (-1.0, 0))[0]:
                seen[self.step] = (norm, micro)
        self.pending.clear()

    def biggest_jump(self, step: int) -> Jump | None:
        """The module whose norm at `step` is the most times its median over the replayed steps before it."""
        best = None
        for (name, phase), by_step in self.norms.items():
            before = [v for s, (v, _) in by_step.items() if s < step]
            if step not in by_step or not before:
                continue
            value, micro = by_step[step]
            median = statistics.median(before)
            ratio = value / median if median > 0 else (math.inf if value > 0 else 1.0)
            if best is None or ratio > best.ratio:
                best = Jump(name, phase, self.rank, micro, value, median, ratio)
        return best

    def summary(self, step: int) -> dict[str, Any]:
        """What this rank found, for rank 0 to gather."""
        jump = self.biggest_jump(step)
        first = self.first
        return {"rank": self.rank, "first": asdict(first) if first else None, "jump": asdict(jump) if jump else None,
                "indices": {s: m for s, m in self.indices.items() if s in {step, first.step if first else step}},
                "losses": self.losses}


class _Reached(Exception):
    """Step S is done: the replay ends there, on every rank at the same step."""


class ReplayTrainer(Trainer):
    """The run's own loop with the recorder's hooks on every module; never saves, ends after `until`."""

    def __init__(self, *args: Any, until: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.until = until
        self.recorder = Recorder(self.env.rank)
        self.recorder.install(self.model)
        self.batches = self.recorder.batches(self.batches)
        backward = self.precision.backward

        def traced(loss: torch.Tensor) -> None:
            self.recorder.loss(loss)
            backward(loss)

        self.precision.backward = traced  # type: ignore[method-assign]

    def _forward_backward(self, step: int) -> Any:
        self.recorder.begin(step)
        try:
            return super()._forward_backward(step)
        finally:
            self.recorder.active = False

    def _report_nan(self, step: int, lr: float, grad_norm: float, loss: float, micro_losses: Any) -> None:
        self.recorder.losses[step] = loss
        super()._report_nan(step, lr, grad_norm, loss, micro_losses)

    def _log_step(self, fields: dict[str, Any]) -> None:
        self.recorder.losses[fields["step"]] = fields["loss"]
        super()._log_step(fields)
        if fields["step"] >= self.until:
            raise _Reached

    def _save(self, *args: Any, **kwargs: Any) -> None:
        """A replay writes no checkpoint: its folder holds the one it started from."""

    def train(self) -> int:
        started = time.perf_counter()
        try:
            code = super().train()
        except _Reached:
            code = self._end("completed", f"replayed to step {self.until}")
        self.recorder.flush()
        found: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(found, self.recorder.summary(self.until))
        if self.env.is_main:
            write_json_atomic(self.paths.root / FINDINGS, verdict(found, self.until, self.start_step,
                                                                  time.perf_counter() - started))
        return code


def verdict(found: list[dict[str, Any]], step: int, start: int, seconds: float) -> dict[str, Any]:
    """Every rank's findings as one: the earliest non-finite value over ranks, else the biggest jump at `step`."""
    firsts = [f["first"] for f in found if f["first"]]
    out: dict[str, Any] = {"step": step, "from_step": start, "world_size": len(found), "steps_s": seconds,
                           "losses": {str(s): v for s, v in sorted(found[0]["losses"].items())}}
    if firsts:
        first = min(firsts, key=lambda h: (h["step"], h["micro"], h["order"], h["rank"]))
        where = first
        out.update(kind="nonfinite", module=first["module"], phase=first["phase"], value=first["amax"])
    else:
        jumps = [f["jump"] for f in found if f["jump"]]
        if not jumps:
            return {**out, "kind": "none"}
        where = {**max(jumps, key=lambda j: j["ratio"]), "step": step}
        out.update(kind="spike", module=where["module"], phase=where["phase"], value=where["value"],
                   median=where["median"], ratio=where["ratio"])
    rank = where["rank"]
    indices = found[rank]["indices"].get(where["step"], {}).get(where["micro"], [])
    out.update(bad_step=where["step"], rank=rank, micro_batch=where["micro"], sample_indices=indices)
    return out
