"""The training loop that runs inside every torchrun worker. It reads top to bottom; the components beside
it (checkpointer, evaluator, precision, faults) decide when and how they act."""
from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from engine import parallel
from engine.anatomy import StepClock
from engine.checkpoint import full
from engine.checkpoint import rollback as rollbacks
from engine.checkpoint.resume import choose_start, start_position
from engine.checkpoint.saver import Checkpointer, Reason
from engine.consensus import Agreed, agree
from engine.data import GlobalOrderSampler, Splits, build_loader
from engine.dist import DistEnv, log, seed_everything
from engine.evaluate import Evaluator
from engine.faults import Faults
from engine.kinds import kind_of
from engine.knobs import TAKES, Tuner
from engine.metrics import FlopCount, device_name, git_commit, gpu_identity, peak_flops
from engine.model import count_params
from engine.optim import build_optimizer, lr_at, set_lr
from engine.precision import Precision
from engine.syncs import SyncCounter
from engine.user import call_model, loss_of, pin_batches, to_device, tokens_per_sample
from mt.contract import builders as event_fields
from mt.contract import door
from mt.contract.anatomy import StepAnatomy
from mt.contract.config import Config
from mt.contract.eventlog import EventWriter, NullEventWriter
from mt.contract.heartbeat import Heartbeat, gpu_fragment
from mt.contract.inbox import ControlInbox, Request, StopSignals
from mt.contract.paths import RunPaths
from mt.rules import StepRules, nan_incident, recompile_incident


@dataclass
class Requests:
    """This step's accepted control requests (rank 0's inbox; none on the other ranks)."""
    checkpoint: list[Request] = field(default_factory=list)
    stop: list[Request] = field(default_factory=list)


class Trainer:
    def __init__(self, cfg: Config, env: DistEnv, paths: RunPaths, attempt: int, splits: Splits, signals: StopSignals) -> None:
        self.cfg, self.env, self.paths, self.attempt, self.splits, self.signals = cfg, env, paths, attempt, splits, signals
        t = cfg.train
        self.events = EventWriter(paths.events) if env.is_main else NullEventWriter()
        self.inbox = ControlInbox(paths.control) if env.is_main else None
        self.heartbeat = Heartbeat(paths.heartbeat(env.rank), env.rank, attempt)
        self.faults = Faults(cfg.faults, env.rank, attempt)
        self.step_rules = StepRules(cfg.monitor, t.grad_clip) if env.is_main else None

        # ---- model, optimizer, precision, the components that act between steps ----------------
        seed_everything(cfg.run.seed)  # identical initial weights on every rank
        # under fsdp whole on rank 0's host only (engine/parallel.py build): never whole on one GPU
        load_device = parallel.host(cfg, env)
        self.kind = kind_of(cfg)
        self.model = parallel.build(lambda: self.kind.build(cfg), cfg, env)
        self.model_name = self.kind.describe(cfg)  # names the model in a run_end that says what it returned
        self.faults.plant(self.model)  # [faults] module: a planted bad layer (mt replay's tests)
        self.n_params, self.n_trainable = count_params(self.model)
        active = getattr(self.model, "active_params", None)
        self.n_active = int(active()) if callable(active) else None
        self.rollback = rollbacks.begin(paths, env)  # a pending rollback: the checkpoints after it set aside first
        found = choose_start(cfg, env, paths, self.events, self.model, load_device)  # init_from: loaded now, whole
        self.wrapped = parallel.wrap(self.model, cfg, env)  # ddp (none on one rank) or fsdp; activation checkpointing
        self.heartbeat.anatomy = StepAnatomy()  # this rank's step parts, in its heartbeat (engine/anatomy.py)
        self.clock = StepClock(self.wrapped, env.device, self.heartbeat.anatomy)
        self.optimizer = build_optimizer(self.model, t, env.device)  # after sharding: over this rank's shards
        self.precision = Precision(cfg, env, self.wrapped)  # autocast; fp16's scaler, sharded under fsdp
        self.checkpoints = Checkpointer(cfg, env, paths, self.events, self.inbox, self.faults, self.wrapped, self.model,
                                        self.optimizer, self.precision.scaler)
        self.evaluator = Evaluator(cfg, env, splits, self.wrapped, self.model, self.precision, self.model_name,
                                   self.events)
        self.recompiles = parallel.Recompiles() if t.compile else None
        self.recompiled = 0  # recompiles since the last step event

        # ---- position: fresh, or from the newest valid checkpoint --------------------------
        start = start_position(found, cfg, env, self.model, self.wrapped, self.optimizer, self.precision.scaler)
        if self.rollback is not None:  # skip its batches, set its lr knob
            self.lr_before = rollbacks.apply(self.rollback, start, env.world_size * t.micro_batch_size * start.accum)
        self.rollbacks, self.spike_rollback = start.rollbacks, False  # made so far; on_spike's, planned for the next step
        self.step, self.samples, self.accum, self.resumed_from = start.step, start.samples, start.accum, start.resumed_from
        self.knobs = start.knobs  # turned by mt set or a rollback; kept in every checkpoint (mt/contract/knobs.py)
        self.tuner = Tuner(self.knobs, cfg, env, self.events, self.inbox, precision=self.precision, evaluator=self.evaluator,
                           checkpointer=self.checkpoints, step_rules=self.step_rules)  # the values in force
        self.start_step = self.step
        self.global_batch = env.world_size * t.micro_batch_size * self.accum
        # tokens exist where a sample has a token dimension (input_ids, or its first integer tensor)
        self.sample_tokens = cfg.model.seq_len if cfg.data.source != "python" else tokens_per_sample(splits.train[0][0])
        self.tokens_per_step = self.global_batch * self.sample_tokens if self.sample_tokens else None
        self.flops_per_token = self.kind.flops_per_token(cfg, self.n_params)
        # not mt's GPT: torch counts the model's FLOPs on this attempt's first step (6N until then)
        self.flops_estimated = not self.kind.exact_flops
        self.flop_count = FlopCount(t.activation_checkpointing) if self.flops_estimated and self.sample_tokens else None
        self.peak = peak_flops(env.device, t.precision)
        self.gpu = gpu_identity(env.device) if env.device.type == "cuda" else None

        self.pin = env.device.type == "cuda" and pin_batches(self._first_sample(), env.device)  # only CPU tensors pin
        self._open_data()
        self.trace: list[list[int]] | None = [] if cfg.debug.trace_samples else None
        self.trace_path = paths.root / "trace" / f"rank{env.rank}.jsonl"
        self.syncs = SyncCounter() if cfg.debug.count_syncs else None  # host-device syncs per step (debug)

    def _open_data(self) -> None:
        """The sampler and loader from the samples position on, as a resume would (a skip reopens them)."""
        cfg, env = self.cfg, self.env
        stall_at = self.faults.stall_at(self.step, self.samples, self.global_batch)
        self.sampler = GlobalOrderSampler(len(self.splits.train), cfg.run.seed, env.rank, env.world_size, self.samples, stall_at)
        self.batches = iter(build_loader(self.splits, self.sampler, cfg.train.micro_batch_size, cfg, env.rank, self.pin))

    def _first_sample(self) -> Any:
        """The first training sample, read without moving any RNG stream (a dataset may draw from them)."""
        rng = full.capture_rng(self.env.device)
        sample = self.splits.train[0][0]
        full.restore_rng(rng, self.env.device)
        return sample

    # ------------------------------------------------------------------------------------
    def train(self) -> int:
        """Run to max_steps or until asked to stop; returns the process exit code."""
        t = self.cfg.train
        self._emit_run_start()
        if self.rollback is not None:
            rollbacks.announce(self.events, self.rollback, self.step, self.knobs.lr_scale, self.lr_before)
        self.heartbeat.beat(self.step)
        while self.step < t.max_steps:
            step = self.step + 1
            lr = lr_at(step, t) * self.knobs.lr_scale
            set_lr(self.optimizer, lr)
            rng_before = full.capture_rng(self.env.device) if t.on_nan != "skip" else None  # saved if this step is NaN
            self.faults.before_step(step)
            requests = self._poll_control()
            self.checkpoints.collect(wait=False)  # a background write that completed is reported now

            # ---- forward/backward, then the step's one collective: what every rank agrees on
            t0 = time.perf_counter()
            if self.syncs is not None:
                self.syncs.start()
            self.clock.lap("start")
            loss_local, micro_losses, data_wait = self._forward_backward(step)
            self.clock.lap("backward")
            self._take_flop_count()
            grad_norm_t = self.precision.unscale_and_clip(self.optimizer, self.model.parameters())
            stop = self.signals.received is not None or bool(requests.stop) or self.spike_rollback
            self.clock.lap("agree_in")
            agreed = agree(self.env, loss_local, stop, bool(requests.checkpoint), grad_norm_t,
                           self.precision.scaler_state(self.optimizer), self.tuner.asked)  # the step's one read from the device
            self.clock.lap("agree_out")
            if self.gpu is not None and agreed.own is not None:   # this rank's GPU and allocator, in its heartbeat
                own = agreed.own
                self.heartbeat.gpu = gpu_fragment(self.gpu[0], own.allocated, own.reserved, own.peak, self.gpu[1])
            grad_norm = agreed.grad_norm
            nonfinite = agreed.nonfinite or self.precision.nonfinite(grad_norm)
            if nonfinite:
                self._report_nan(step, lr, grad_norm, agreed.loss, micro_losses)
                rolled, why = rollbacks.after_nan(self.paths, self.env, step, self.rollbacks, t) \
                    if t.on_nan == "rollback" else (False, "non-finite loss with train.on_nan = \"stop\"")
                if rolled:  # the next attempt continues from the checkpoint before this step
                    return self._end(rollbacks.RUN_END, why)
                if t.on_nan != "skip":
                    self.optimizer.zero_grad(set_to_none=True)
                    self._save("stop", requests, rng_override=rng_before)
                    return self._end("stopped", why)

            # ---- the optimizer step (fp16's scaler may skip it), then what the step reports
            skipped, scale = self.precision.step(self.optimizer, nonfinite, agreed.found_inf, agreed.scale, agreed.growth)
            self.optimizer.zero_grad(set_to_none=True)
            self.clock.lap("optim")
            self.clock.end(data_wait)
            step_time = time.perf_counter() - t0
            self.step, self.samples = step, self.samples + self.global_batch
            self.heartbeat.beat(step)
            self._write_trace(step)
            fields = self._step_fields(step, lr, grad_norm, step_time, data_wait, skipped, scale, agreed)
            if self.syncs is not None:
                fields["host_syncs"] = self.syncs.stop()
            self._log_step(fields)

            # ---- the components decide whether they act at this step
            if self.evaluator.due(step):
                self.heartbeat.beat(step, "eval")
                fields, samples = self.evaluator.run(step)
                self.events.emit("eval", step=step, **fields)
                for sample in samples:  # [eval] prompts' continuations (engine/samples.py)
                    self.events.emit("sample", step=step, **sample)
            reason = self.checkpoints.due(step, agreed.stop, agreed.checkpoint)
            if agreed.knob:  # before the save: the checkpoint of this step keeps them
                self._turn_knobs(step)
            if reason:
                self._save(reason, requests)
            if agreed.stop and self.spike_rollback and self.env.is_main:  # rank 0 alone writes run_end
                return self._end(rollbacks.RUN_END, "rolling back after a loss spike (train.on_spike = \"rollback\")")
            if agreed.stop:
                return self._end("stopped", f"{self.signals.name} received" if self.signals.received else "stop requested")
        return self._end("completed", f"reached max_steps = {t.max_steps}")

    # ------------------------------------------------------------------------------------
    def _forward_backward(self, step: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor, list[int]]], float]:
        """All micro-steps of one optimizer step; gradients sync only on the last (no_sync before).

        Returns the mean loss, (loss, sample indices) of each micro-batch, and the data wait.
        Nothing here reads a value back from the device, so micro-steps queue without a sync."""
        loss_sum = torch.zeros((), device=self.env.device, dtype=torch.float64)
        micro_losses = []
        data_wait = 0.0
        for micro in range(self.accum):
            t0 = time.perf_counter()
            batch, idx = next(self.batches)
            data_wait += time.perf_counter() - t0
            batch = to_device(batch, self.env.device)
            sync = micro == self.accum - 1
            count = self.flop_count  # the first step only, and only where torch counts the FLOPs
            with (nullcontext() if sync else self.wrapped.no_sync()):
                with count.forward() if count else nullcontext(), self.precision.autocast():
                    loss = loss_of(call_model(self.wrapped.module, batch), self.model_name)
                self.faults.in_forward(micro)
                loss = self.faults.maybe_poison(loss, step, micro)
                with count.backward() if count else nullcontext():
                    self.precision.backward(self.faults.maybe_overflow(loss / self.accum, step))
            micro_losses.append((loss.detach(), idx))
            if self.trace is not None:
                self.trace.append(idx)
            loss_sum += loss.detach()
        return loss_sum / self.accum, micro_losses, data_wait

    def _take_flop_count(self) -> None:
        """After the first step's forward and backward: FLOPs per token from torch's count of this rank's
        tokens, replacing the 6N estimate (kept where the counter saw no matmul)."""
        count, self.flop_count = self.flop_count, None
        if count is None or not self.sample_tokens:
            return
        tokens = self.cfg.train.micro_batch_size * self.accum * self.sample_tokens
        if count.total() > 0:
            estimate, self.flops_per_token, self.flops_estimated = self.flops_per_token, count.total() / tokens, False
            log(f"FLOPs per token counted by torch at the first step: {self.flops_per_token:.4g} (6N estimate {estimate:.4g})")
        else:
            log("torch's FLOP counter saw no matmul at the first step: MFU uses the 6N estimate")

    def _log_step(self, fields: dict[str, Any]) -> None:
        """The step event every log_every steps and at the last; the incidents rank 0's rules see in it, every step."""
        step = fields["step"]
        self._note_recompiles(step, fields)
        if step % self.tuner.log_every == 0 or step == self.cfg.train.max_steps:
            self.events.emit("step", **fields)
            self.recompiled = 0
        if self.step_rules is not None:
            for incident in self.step_rules.observe(fields):
                self.events.emit("incident", **incident.event_fields())
                if incident.code == "loss_spike" and self.cfg.train.on_spike == "rollback" and not self.spike_rollback:
                    # rank 0 alone sees it: the next step's agreement carries it to every rank as a stop
                    planned = rollbacks.plan(self.paths, step, self.rollbacks, self.cfg.train, "on_spike", "loss spike")
                    self.spike_rollback = not isinstance(planned, str)

    def _note_recompiles(self, step: int, fields: dict[str, Any]) -> None:
        """A compiled run's step says how often it recompiled; a recompile is an incident with torch's reason."""
        if self.recompiles is None:
            return
        found = self.recompiles.take()
        self.recompiled += len(found)
        fields["recompiles"] = self.recompiled
        if found:
            log(f"step {step} recompiled: {'; '.join(why for _, why in found)}")
            self.events.emit("incident", **recompile_incident(step, found).event_fields())

    def _write_trace(self, step: int) -> None:
        if self.trace is None:
            return
        self.trace_path.parent.mkdir(exist_ok=True)
        fd = door.open_append(self.trace_path)
        try:
            os.write(fd, (json.dumps({"attempt": self.attempt, "step": step, "rank": self.env.rank, "micro_batches": self.trace}) + "\n").encode())
        finally:
            os.close(fd)
        self.trace = []

    def _report_nan(self, step: int, lr: float, grad_norm: float, loss: float, micro_losses: list[tuple[torch.Tensor, list[int]]]) -> None:
        bad_local = [int(i) for micro_loss, idx in micro_losses if not torch.isfinite(micro_loss) for i in idx]
        gathered: list[list[int]] = [[] for _ in range(self.env.world_size)]
        dist.all_gather_object(gathered, bad_local)
        indices = sorted({i for part in gathered for i in part})
        log(f"non-finite loss/gradients at step {step}: samples {indices[:32]}")
        self.events.emit("incident", **nan_incident(step, lr, grad_norm, loss, indices, self.cfg.train.on_nan).event_fields())

    # ---- control, checkpoints, events ------------------------------------------------------
    def _poll_control(self) -> Requests:
        found = Requests()
        if self.inbox is None:
            return found
        polled = self.inbox.poll()
        for rid, action, why in polled.rejected:
            self.events.emit("control", **event_fields.control_answer(rid, action, "rejected", why))
        for req in polled.requests:
            {"stop": found.stop, "checkpoint": found.checkpoint, "set": self.tuner.pending}[req.action].append(req)
            self.events.emit("control", **event_fields.accepted(req.id, req.action, self.step + 1))
        return found

    def _turn_knobs(self, step: int) -> None:
        """Collective: this step's settings, from the next step on; a skip moves the data position."""
        skip = self.tuner.apply(step).skip_batches
        if skip:
            self.samples += skip * self.global_batch
            self._open_data()

    def _save(self, reason: Reason, requests: Requests, rng_override: dict | None = None) -> None:
        """Collective: this step's checkpoint, written (or started in the background) by the checkpointer."""
        self.heartbeat.beat(self.step, "checkpoint")
        position = {
            "step": self.step, "samples_seen": self.samples, "tokens_seen": self.samples * (self.sample_tokens or 0),
            "world_size": self.env.world_size, "grad_accum_steps": self.accum,
            "micro_batch_size": self.cfg.train.micro_batch_size, "global_batch": self.global_batch, "attempt": self.attempt,
            "knobs": self.knobs.to_state(), "rollbacks": self.rollbacks,
        }
        self.checkpoints.save(reason, requests.checkpoint + requests.stop, position, rng_override)

    def _step_fields(self, step: int, lr: float, grad_norm: float, step_time: float, data_wait: float,
                     skipped: bool, scale: float | None, agreed: Agreed) -> dict[str, Any]:
        per_s = 1 / step_time if step_time > 0 else 0.0
        tps = self.tokens_per_step * per_s if self.tokens_per_step else None
        fields = {
            "step": step, "epoch": self.sampler.epoch_of(self.samples - 1), "loss": agreed.loss, "lr": lr,
            "grad_norm": grad_norm, "clipped": bool(self.precision.grad_clip and grad_norm > self.precision.grad_clip),
            "tokens_per_s": tps, "step_time_s": step_time, "data_wait_s": data_wait,
            "samples_seen": self.samples, "tokens_seen": self.samples * self.sample_tokens if self.sample_tokens else None,
            "skipped": skipped, "mem_alloc_bytes": agreed.mem, "mem_peak_bytes": agreed.peak,
            "samples_per_s": self.global_batch * per_s,
        }
        if scale is not None:
            fields["loss_scale"] = scale
        if tps is not None:
            fields["flops_per_token"] = self.flops_per_token
            if self.flops_estimated:
                fields["flops_estimated"] = True
        if self.peak and tps is not None:
            fields["mfu"] = tps * self.flops_per_token / (self.peak * self.env.world_size)
        return fields

    def _emit_run_start(self) -> None:
        cfg, env = self.cfg, self.env
        self.events.emit("run_start", **event_fields.run_start(
            run_id=self.paths.root.name, attempt=self.attempt, world_size=env.world_size,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size)), device=device_name(env.device),
            backend=env.backend, precision=cfg.train.precision, config=cfg.to_dict(), params_total=self.n_params,
            params_trainable=self.n_trainable, tokens_per_step=self.tokens_per_step,
            # fp32 weights + grads + 2 AdamW moments, per rank: FSDP keeps a 1/world shard of each
            effective_batch=self.global_batch, static_mem_bytes=16 * self.n_trainable // (env.world_size if self.wrapped.strategy == "fsdp" else 1),
            start_step=self.start_step, max_steps=cfg.train.max_steps, resumed_from=self.resumed_from,
            torch_version=torch.__version__, git_commit=git_commit(), grad_accum_steps=self.accum,
            micro_batch_size=cfg.train.micro_batch_size, seq_len=self.sample_tokens, flops_per_token=self.flops_per_token,
            params_active=self.n_active, model=self.model_name, strategy=self.wrapped.strategy,
            activation_checkpointing=cfg.train.activation_checkpointing, compile=cfg.train.compile,
            peak_flops=self.peak, data_loss_floor=self.splits.loss_floor, pid=os.getpid(), knobs=list(TAKES),
        ))
        log(f"run_start attempt {self.attempt}: {self.n_params} params, world {env.world_size} on {env.device}, "
            f"global batch {self.global_batch}{f' x {self.sample_tokens} tokens' if self.sample_tokens else ' samples'}"
            f", from step {self.start_step}")

    def _end(self, status: str, reason: str) -> int:
        self.checkpoints.collect(wait=True)  # a write in flight is finished (and reported) first
        self.tuner.reject_pending(f"the run ended ({status}) at step {self.step} before applying it")
        rollbacks.settle(self.paths, self.env)
        self.events.emit("run_end", step=self.step, status=status, reason=reason)
        log(f"run_end {status}: {reason}")
        return 0
