"""The run's checkpoints as the loop sees them: `due(step, ...)` decides whether a step saves and why,
`save(reason, ...)` writes it, `collect()` between steps.

It writes full (full.py, rank 0) or sharded (sharded.py, every rank; in the background with
checkpoint.async) and reports each one itself: the `checkpoint` event with the
time the loop waited, the answers to the requests it served, and an incident for a full disk or a
background write that failed (never a half checkpoint: that one is removed, never renamed).
"""
from __future__ import annotations

import math
import time
from typing import Any, Literal

import torch
import torch.distributed as dist

from engine import parallel
from engine.checkpoint import folder, full, sharded
from engine.dist import DistEnv, log, report_failure
from engine.faults import Faults
from mt.contract import builders as event_fields
from mt.contract import checkpoints
from mt.contract.config import Config
from mt.contract.inbox import ControlInbox, Request
from mt.contract.paths import RunPaths
from mt.contract.release import eval_numbers
from mt.contract.space import DiskFullError
from mt.rules import checkpoint_failed_incident, disk_full_incident

Reason = Literal["stop", "final", "request", "interval"]  # why a checkpoint is written: its event's `reason`
_LAST: tuple[Reason, ...] = ("final", "stop")  # the run's last weights: ending without them must not look like success


class Checkpointer:
    def __init__(self, cfg: Config, env: DistEnv, paths: RunPaths, events: Any, inbox: ControlInbox | None, faults: Faults,
                 par: parallel.Parallel, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any) -> None:
        self.cfg, self.env, self.paths, self.events, self.inbox, self.faults = cfg, env, paths, events, inbox, faults
        self.par, self.model, self.optimizer, self.scaler = par, model, optimizer, scaler
        self.writer: sharded.ShardedWriter | None = None  # made at the first sharded checkpoint
        self.every = cfg.checkpoint.every_steps  # the checkpoint_every knob's value in force (engine/knobs.py)

    def due(self, step: int, stop: bool, requested: bool) -> Reason | None:
        """Whether `step` (just taken) saves, and why: a stop first, then the last step, a request
        (`requested`: any rank's), then every checkpoint.every_steps; None: it does not."""
        if stop:
            return "stop"
        if step == self.cfg.train.max_steps:
            return "final"
        if requested:
            return "request"
        every = self.every
        return "interval" if every and step % every == 0 else None

    def save(self, reason: Reason, reqs: list[Request], position: dict[str, Any], rng_override: dict | None = None) -> None:
        """Collective: gather every rank's RNG state, then write full (rank 0, atomically) or sharded
        (every rank); `reqs` are the requests this checkpoint answers."""
        self.collect(wait=True)  # at most one write in flight: the previous one finishes first
        t0 = time.perf_counter()
        step = position["step"]
        rng = rng_override or full.capture_rng(self.env.device)
        rngs: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(rngs, rng, group=self.env.host_group)  # on the host: no GPU staging
        train_state = {**position, "rng": rngs}
        meta = {"world_size": self.env.world_size, "global_batch": position["global_batch"],
                "samples_seen": position["samples_seen"], "reason": reason, "rollbacks": position.get("rollbacks", 0), **self._best_meta(step)}
        if self.cfg.checkpoint_format == "sharded":
            self._save_sharded(step, reason, reqs, train_state, meta, t0)
        else:
            model_sd, optim_sd = parallel.full_state(self.par, self.model, self.optimizer)  # collective under fsdp
            if self.env.is_main:
                parts = {
                    "model.pt": model_sd,
                    "optim.pt": {"optimizer": optim_sd, "scaler": self.scaler.state_dict()},
                    "train.pt": train_state,
                }
                try:
                    saved = full.save_and_prune(self.paths.checkpoints, step, parts, meta, self.cfg.checkpoint.keep_last,
                                                      self.faults.in_checkpoint(step))
                except DiskFullError as e:
                    self._report_disk_full(e, step, reason, reqs)
                    if reason in _LAST:
                        raise
                    saved = None
                if saved is not None:
                    self._report_saved(saved, step, reason, reqs, time.perf_counter() - t0)
        # the others wait for rank 0's write on the host group, whose timeout no checkpoint size reaches
        # (the default group's pg_timeout_s would end them while a large checkpoint is still being written)
        dist.barrier(group=self.env.host_group)

    def _best_meta(self, step: int) -> dict[str, Any]:
        """The manifest's `best` field: the eval at this very step (the loop evaluates before it saves);
        a checkpoint without one, or without its number of best_metric, is no candidate (value null)."""
        c = self.cfg.checkpoint
        if not c.keep_best:
            return {}
        ev = self.events.last.get("eval")
        value = eval_numbers(ev).get(c.best_metric) if ev is not None and ev.get("step") == step else None
        value = value if value is not None and math.isfinite(value) else None   # a NaN eval is no candidate
        return {"best": checkpoints.best_field(c.best_metric, c.best_mode, value, c.keep_best)}

    def _best_event(self) -> dict[str, Any]:
        """The checkpoint event's `best` and `best_metric`: the best ones on disk after this save, best first."""
        if not self.cfg.checkpoint.keep_best:
            return {}
        found = checkpoints.best(self.paths.checkpoints)
        return {"best": {str(b.step): b.value for b in found}, "best_metric": self.cfg.checkpoint.best_metric}

    def collect(self, wait: bool) -> None:
        """Report a background write that has completed (wait: block until the one in flight has)."""
        if self.writer is None:
            return
        p = self.writer.wait() if wait else self.writer.finished()
        if p is not None:
            self._report_written(p, background=True)

    def _save_sharded(self, step: int, reason: str, reqs: list[Request], train_state: dict[str, Any], meta: dict[str, Any],
                      t0: float) -> None:
        """Every rank writes its shards (sharded.py); blocking, or in the background with checkpoint.async."""
        if self.writer is None:
            self.writer = sharded.ShardedWriter(self.paths.checkpoints, self.cfg.checkpoint.keep_last, self.env.is_main,
                                                self.cfg.checkpoint.async_)
        # the scaler is one small dict: in train.pt, beside the position
        train = {**train_state, "scaler": self.scaler.state_dict()} if self.env.is_main else None
        try:
            done = self.writer.save(step, sharded.state_of(self.model, self.optimizer), train, meta,
                                    {"reason": reason, "reqs": reqs}, self.faults.in_checkpoint(step), t0)
        except DiskFullError as e:  # rank 0 only: it decided, the others skipped with it
            self._report_disk_full(e, step, reason, reqs)
            if reason in _LAST:
                raise
            return
        if done is not None:
            self._report_written(done, background=False)

    def _report_written(self, p: sharded.Pending, background: bool) -> None:
        """Rank 0: the checkpoint event of a sharded write, or what became of a failed one."""
        if not self.env.is_main:
            return
        reason, reqs = p.info["reason"], p.info["reqs"]
        if p.saved is not None:
            self._report_saved(p.saved, p.step, reason, reqs, p.blocking_s)
            return
        if isinstance(p.error, DiskFullError):
            self._report_disk_full(p.error, p.step, reason, reqs)
            if reason in _LAST:
                raise p.error
            return
        if not background:
            raise p.error  # a blocking write that failed ends the run, as a full checkpoint's does
        why = report_failure(p.error)
        last = self._newest()
        log(f"checkpoint ({reason}) step {p.step} failed in the background: {why}; {last}")
        self.events.emit("incident", **checkpoint_failed_incident(p.step, why, last, reason, self.paths.checkpoints).event_fields())
        self._reject(reqs, why)

    def _report_saved(self, saved: folder.Saved, step: int, reason: str, reqs: list[Request], blocking_s: float) -> None:
        """Rank 0: the checkpoint event (written and renamed into place) and the answers to its requests."""
        waited = min(blocking_s, saved.seconds)
        self.events.emit("checkpoint", **event_fields.checkpoint(step, str(saved.path), saved.bytes, round(saved.seconds, 4), reason,
                                                                [r.id for r in reqs], blocking_s=round(waited, 4)),
                         **self._best_event())
        for req in reqs:
            self.events.emit("control", **event_fields.saved(req.id, req.action, step, saved.path))
            self._done(req)
        log(f"checkpoint ({reason}) step {step}: {saved.path} {saved.bytes} bytes in {saved.seconds:.2f}s (the loop waited {waited:.2f}s)")

    def _report_disk_full(self, e: DiskFullError, step: int, reason: str, reqs: list[Request]) -> None:
        """A checkpoint that did not fit: an incident, and an answer to the requests waiting for it."""
        final = reason in _LAST
        log(f"checkpoint ({reason}) step {step} {'failed' if final else 'skipped'}: {e}")
        then = "the run ends as failed" if final else "training goes on and the next checkpoint tries again"
        self.events.emit("incident", **disk_full_incident(step, e, reason, self._newest(), then, self.cfg.checkpoint.keep_last).event_fields())
        self._reject(reqs, str(e))

    def _newest(self) -> str:
        newest = checkpoints.newest(self.paths.checkpoints, "sizes").path  # hashes: a reread of every byte
        return f"the newest checkpoint stays {newest.name}" if newest else "there is no checkpoint yet"

    def _reject(self, reqs: list[Request], why: str) -> None:
        """Checkpoint requests this failed write would have answered (a stop still stops)."""
        for req in reqs:
            if req.action == "checkpoint":
                self.events.emit("control", **event_fields.control_answer(req.id, req.action, "rejected", why))
                self._done(req)

    def _done(self, req: Request) -> None:
        if self.inbox is not None:
            self.inbox.done(req.path)
