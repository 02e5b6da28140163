"""Synthetic run directories that follow the event schema (docs/events.md) exactly (written via mt.contract.events).

`event_line` and `write_status` are the one way the tests write a synthetic run's events.jsonl
lines and status.json (SynthRun here, FakeRun in tests/diagnose/fakerun.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mt.contract.events import SCHEMA_VERSION, dumps, make_event
from mt.contract.jsonl import write_json_atomic
from mt.contract.paths import RunPaths

T0 = 1_700_000_000.0


def event_line(kind: str, t: float, *, partial: bool = False, **fields: Any) -> str:
    """One events.jsonl line as the engine writes it: make_event's envelope (v, t, kind) and
    mt.contract.events.dumps' encoding (non-finite floats as strings).

    make_event raises on a field the schema requires and `fields` lacks; `partial` skips that
    check, for a line holding only the fields the rule under test reads (FakeRun's).
    """
    if partial:
        return dumps({"v": SCHEMA_VERSION, "t": t, "kind": kind, **fields})
    ev = make_event(kind, **fields)
    ev["t"] = t
    return dumps(ev)


def write_status(paths: RunPaths, status: dict[str, Any]) -> None:
    """status.json as the supervisor writes it: the whole dict, atomically."""
    write_json_atomic(paths.status, status)


def loss_at(step: int) -> float:
    """A smooth, decreasing, deterministic loss curve."""
    return 5.5 * math.exp(-step / 60) + 1.2 + 0.05 * math.sin(step)


@dataclass
class SynthRun:
    """Builds a run directory event by event."""

    root: Path
    name: str = "synth"
    max_steps: int = 100
    t: float = T0
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.paths = RunPaths(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = {"run": {"name": self.name}, "train": {"max_steps": self.max_steps, "grad_clip": 1.0}}
        (self.root / "config.json").write_text(json.dumps(cfg))

    def event(self, kind: str, dt: float = 0.5, **fields: Any) -> None:
        self.t += dt
        self.lines.append(event_line(kind, self.t, **fields))

    def run_start(self, attempt: int = 1, start_step: int = 0, device: str = "cpu", world_size: int = 2) -> None:
        self.event("run_start", run_id="r1", attempt=attempt, world_size=world_size, nnodes=1,
                   device=device, backend="gloo" if device == "cpu" else "nccl", precision="fp32",
                   config={}, params_total=800_000, params_trainable=800_000, tokens_per_step=4096,
                   effective_batch=32, static_mem_bytes=0, start_step=start_step,
                   max_steps=self.max_steps, resumed_from=None, torch_version="2.13",
                   git_commit=None)

    def step(self, step: int, loss: float | None = None, grad_norm: float = 0.8,
             tokens_per_s: float | None = None) -> None:
        self.event("step", step=step, epoch=0, loss=loss_at(step) if loss is None else loss,
                   lr=1e-3 * min(1.0, step / 10), grad_norm=grad_norm, clipped=grad_norm > 1.0,
                   tokens_per_s=8192.0 + step if tokens_per_s is None else tokens_per_s,
                   step_time_s=0.5, data_wait_s=0.01,
                   samples_seen=32 * step, tokens_seen=4096 * step, skipped=False,
                   mem_alloc_bytes=0, mem_peak_bytes=0)

    def flush(self) -> None:
        self.paths.events.write_text("".join(line + "\n" for line in self.lines))

    def status(self, state: str, attempt: int = 1, reason: str | None = None,
               exit_code: int | None = None, ended: float | None = None) -> None:
        write_status(self.paths, {
            "state": state, "attempt": attempt, "supervisor_pid": 1, "torchrun_pid": 2,
            "started": T0, "ended": ended, "exit_code": exit_code, "reason": reason})


def running_run(root: Path, steps: int = 5, max_steps: int = 10) -> SynthRun:
    """A live run: start, `steps` steps, state running (`complete` ends it)."""
    r = SynthRun(root, max_steps=max_steps)
    r.run_start()
    for s in range(1, steps + 1):
        r.step(s)
    r.flush()
    r.status("running")
    return r


def complete(r: SynthRun, step: int) -> None:
    """The run ends well after `step`: run_end, then its final state."""
    r.event("run_end", step=step, status="completed", reason="max_steps reached")
    r.flush()
    r.status("completed", exit_code=0, ended=r.t)


def finished_run(root: Path, steps: int = 100) -> SynthRun:
    """A completed run: start, `steps` steps, evals every 25, checkpoints every 50, run_end."""
    r = SynthRun(root, max_steps=steps)
    r.run_start()
    for s in range(1, steps + 1):
        r.step(s)
        if s % 25 == 0:
            r.event("eval", step=s, val_loss=loss_at(s) + 0.1)
        if s % 50 == 0:
            r.event("checkpoint", step=s, path=f"checkpoints/step-{s}", bytes=1000, seconds=0.1,
                    reason="interval", request_id=None)
    r.event("run_end", step=steps, status="completed", reason="max_steps reached")
    r.flush()
    r.status("completed", exit_code=0, ended=r.t)
    return r
