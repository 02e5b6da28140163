"""The library a training script uses: `run = mt.init()`, then `run.step(...)` every optimizer step.

Under `mt launch` it joins the run directory the supervisor made (MT_RUN_DIR); under plain
`python` or `torchrun` it makes one itself (mt/ownrun.py), so `mt watch` and `mt ckpt` work
there too. It writes through the same writers as mt's engine: events, heartbeats, the control
inbox. Stdlib only; torch is used only once the script has imported it. docs/library.md.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Mapping

from mt.agree import Agreement
from mt.contract import builders as event_fields
from mt.contract.anatomy import StepAnatomy
from mt.contract.eventlog import EventWriter
from mt.contract.events import INT_MAX, SAMPLE_TEXT_MAX
from mt.contract.fmt import failure_reason, tree_size
from mt.contract.heartbeat import BackgroundHeartbeat
from mt.contract.inbox import ControlInbox, Polled, Request, StopSignals
from mt.facts import Facts
from mt.rolledback import announce as announce_rollback
from mt.rolledback import spent as rollback_spent
from mt.scored import ScriptBest
from mt.started import Start
from mt.stepbatch import StepBatch
from mt.values import as_number, as_whole, plain, step_number

ENV_RUN_DIR, ENV_ATTEMPT = "MT_RUN_DIR", "MT_ATTEMPT"
_KNOWN = ("loss", "lr", "grad_norm", "tokens")
# rank 0's heartbeat thread, not the training thread, looks into control/ and writes the batched
# step events this often: a key press is seen within it, the viewer polls about as often
_TICK_S = 0.25
_WHOLE_MAX = INT_MAX  # a step the parser takes (mt/contract/events.py `whole`): 0 <= step < 2**63
_REFUSED = {"set": "the script reads no knobs: mt set turns the knobs of mt's own engine (docs/library.md)"}


@dataclass(frozen=True)
class Control:
    """What to do after this step; the same on every rank."""

    checkpoint: bool = False
    stop: bool = False


_GO = Control()  # the answer of almost every step: shared, it is frozen


class Run:
    """One attempt of a script's run, as the script sees it: made by `mt.init` only (the type is for annotations)."""

    def __init__(self, start: Start | None = None) -> None:
        # the run directory, the signal handler and the exception hook are init's: a second Run of one process would fight it
        if not isinstance(start, Start):
            raise TypeError("mt: a Run is made by mt.init(...), not by calling mt.Run")
        paths, rank, usable, attempt = start.paths, start.rank, start.usable, start.attempt
        self.dir = paths.root
        self.rank, self.world_size, self.attempt = rank, start.world_size, attempt
        self.paths, self.config, self.max_steps = paths, dict(start.config or {}), start.max_steps
        self.facts = start.facts  # what the script said at mt.init: the header's precision, device, batch, clip
        self._recorded: tuple[int, float] | None = None  # run.record's previous (step, time): the steps between are timed
        self.owned = start.owned and usable
        self.resume_from: Path | None = None
        # a rollback (`mt rollback`): skip this many batches after resume_from; lr_scale (None: keep yours) from there on
        self.skip_batches, self.lr_scale, self.rollback = 0, None, None
        self.failures = start.failures  # mt's writes that failed: said once, never raised into the loop
        self._events: EventWriter | None = None
        self._inbox: ControlInbox | None = None
        if rank == 0 and usable:
            with self.failures.guard(paths.events):
                self._events = EventWriter(paths.events)
            with self.failures.guard(paths.control):
                self._inbox = ControlInbox(paths.control)
        # rank 0's thread polls control/, writes the batched steps and runs the rules: a step only notes itself
        self._heartbeat = BackgroundHeartbeat(paths.heartbeat(rank) if usable else None, rank, attempt,
                                              on_tick=self._tick if self._events is not None else None, tick_s=_TICK_S)
        if self._heartbeat.error is not None and usable:
            self.failures.note(paths.heartbeat(rank), self._heartbeat.error)
        self._agree = Agreement(start.world_size)
        self._signals = StopSignals((signal.SIGTERM,))  # a handler that only sets a flag: the script saves at its next step
        if threading.current_thread() is threading.main_thread():
            self._signals.install()
        self._pending: list[Request] = []  # accepted requests that the next checkpoint_saved answers
        self._asked: list[Request] = []  # accepted by the thread, not yet seen by a step
        self._last_t: float | None = None
        self._agreed_s = 0.0  # the last step's time inside mt (its agreement: a wait for the other ranks)
        self._heartbeat.anatomy = StepAnatomy()
        self._step: int | None = None
        self._stopping: str | None = None
        self._started = False
        self._finished = False
        self._step_rules: Any = None
        self._nan_open = False
        self._steps = StepBatch()  # step events not written yet
        self._best = ScriptBest(paths.events)  # the numbers of the checkpoints it reports (checkpoint_saved(metrics=...))
        self._lock = threading.RLock()  # the thread's tick against the training thread's own writes
        self._heartbeat.beat(0, "start")

    # ---- every optimizer step -----------------------------------------------------------
    def step(self, step: int, *, loss: float | None = None, lr: float | None = None, grad_norm: float | None = None,
             tokens: int | None = None, data_s: float | None = None, epoch: float | None = None, **metrics: float) -> Control:
        """Record optimizer step `step` (rank 0 writes it), beat this rank's heartbeat and say
        whether to checkpoint or stop now: one tiny collective keeps every rank in agreement.
        `data_s`: the seconds this step waited for its batch (the heartbeat's step anatomy); `epoch`: 2, or 1.25."""
        now = time.perf_counter()
        if data_s is not None and not (type(data_s) is float and 0.0 <= data_s < math.inf):
            data_s = as_number(data_s, "data_s", nonneg=True, finite=True)
        if self._last_t is not None:  # the step: since the last call; mt's own part: inside that call
            self._heartbeat.anatomy.add(now - self._last_t, data_s, mt_s=self._agreed_s)
        # checked before anything is noted, so a refused value changes nothing; a plain float
        # passes on a type check (NaN too: the parser keeps it)
        if type(loss) is not float and loss is not None:
            loss = step_number(loss, "loss")
        if not (type(lr) is float and lr >= 0.0) and lr is not None:
            lr = step_number(lr, "lr")
        if not (type(grad_norm) is float and grad_norm >= 0.0) and grad_norm is not None:
            grad_norm = step_number(grad_norm, "grad_norm")
        extra = {k: as_number(v, k) for k, v in metrics.items()} if metrics else None
        if epoch is not None:
            epoch = as_number(epoch, "epoch", nonneg=True, finite=True)
        ctl, tokens_all = self._sync(step, tokens)
        self._emit_step(self._step or 0, None if self._last_t is None else now - self._last_t, 1,
                        loss, lr, grad_norm, tokens_all, extra, epoch)
        self._last_t, self._agreed_s = now, time.perf_counter() - now
        return ctl

    # ---- the two halves of a step, for an adapter whose framework logs apart from its steps --------
    def sync(self, step: int) -> Control:
        """Every rank, every optimizer step: the heartbeat, control requests and the agreement."""
        return self._sync(step, None)[0]

    def record(self, step: int, *, loss: float | None = None, lr: float | None = None, grad_norm: float | None = None,
               tokens: int | None = None, epoch: float | None = None, **metrics: float) -> None:
        """Rank 0 records step `step`'s numbers, checked as `step` checks them (on every rank);
        `tokens`: the count over every rank of the steps since the previous record (nothing is summed
        here). The time since that record, over the steps between, is the step time."""
        at = as_whole(step, "step")
        values = (step_number(loss, "loss"), step_number(lr, "lr"), step_number(grad_norm, "grad_norm"),
                  as_number(tokens, "tokens", nonneg=True, finite=True))
        said_epoch = as_number(epoch, "epoch", nonneg=True, finite=True)
        now = time.perf_counter()
        before, self._recorded = self._recorded, (at, now)
        steps = at - before[0] if before is not None and at > before[0] else 0
        self._emit_step(at, now - before[1] if steps else None, max(1, steps), *values,
                        {k: as_number(v, k) for k, v in metrics.items()} or None, said_epoch)

    def log(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Extra metrics (an eval, say) at `step` (default: the last step); rank 0 writes them."""
        if self._events is None:
            return
        at = as_whole(step if step is not None else (self._step or 0), "step")
        values = {str(k): as_number(v, str(k)) for k, v in metrics.items()}
        self._ensure_started(at)
        self._flush()
        with self.failures.guard(self.paths.events):
            self._events.emit("metrics", step=at, values=values)

    def sample(self, prompt: str, text: str, step: int | None = None, index: int = 0, tokens: int | None = None) -> None:
        """What the model generated after `prompt` at `step` (default: the last step): a `sample` event from rank 0
        (each text cut at SAMPLE_TEXT_MAX characters)."""
        if self._events is None:
            return
        if not isinstance(prompt, str) or not isinstance(text, str):
            raise TypeError(f"run.sample: prompt and text must be strings, got {type(prompt).__name__} and {type(text).__name__}")
        at, i = as_whole(step if step is not None else (self._step or 0), "step"), as_whole(index, "index")
        self._ensure_started(at)
        self._flush()
        with self.failures.guard(self.paths.events):
            self._events.emit("sample", step=at, index=i, prompt=prompt[:SAMPLE_TEXT_MAX], text=text[:SAMPLE_TEXT_MAX], tokens=None if tokens is None else as_whole(tokens, "tokens"))

    def checkpoint_saved(self, path: str | os.PathLike[str], step: int | None = None, *, metrics: Mapping[str, float] | None = None,
                         best_metric: str = "val_loss", best_mode: str = "min", keep_best: int = 1) -> None:
        """The script saved a checkpoint at `path`: answer the requests waiting for one, and let
        later attempts find it in `resume_from`; with `metrics`, the best `keep_best` by `best_metric` are marked."""
        if self._events is None:
            return
        at = as_whole(step if step is not None else (self._step or 0), "step")
        where = Path(path).absolute()
        self._ensure_started(at)
        self._flush()
        best = self._best.fields(at, where, metrics, best_metric, best_mode, keep_best) if metrics else {}  # checked first
        reqs, self._pending = self._pending, []  # what a step took: one asked later waits for a save after it
        reason = "stop" if self._stopping else "request" if reqs else "script"
        with self.failures.guard(self.paths.events):
            self._events.emit("checkpoint", **event_fields.checkpoint(at, str(where), tree_size(where), None, reason,
                                                                     [r.id for r in reqs]), **best)
        rollback_spent(self.paths, self.rollback)
        self.rollback = None
        for req in reqs:
            with self.failures.guard(self.paths.events):
                self._events.emit("control", **event_fields.saved(req.id, req.action, at, where))
            if self._inbox is not None:  # answered by the save, even if the answer could not be written
                self._inbox.done(req.path)

    def finish(self, status: str | None = None, reason: str | None = None) -> None:
        """The run ended: `completed` (or `stopped` after a stop), or what `status` says."""
        if self._finished:
            return
        self._finished = True
        final = status or ("stopped" if self._stopping else "completed")
        why = reason or self._stopping or ("the script finished" if final == "completed" else final)
        if self.owned and self.rank == 0 and self.failures.count:
            with self.failures.guard(self.paths.reserve):  # room for the run's end, on a full disk
                self.paths.reserve.unlink(missing_ok=True)
        if self._events is not None:
            self._ensure_started(self._step or 0)
            with self._lock:  # a tick after this finds the run finished
                self._flush()
                for req in self._pending + self._asked:
                    done = req.action == "stop" and final == "stopped"
                    with self.failures.guard(self.paths.events):
                        self._events.emit("control", **event_fields.control_answer(
                            req.id, req.action, "done" if done else "rejected",
                            f"stopped at step {self._step}" if done else f"the script ended ({final}) without saving a checkpoint"))
                    if self._inbox is not None:
                        self._inbox.done(req.path)
                self._pending, self._asked = [], []
                with self.failures.guard(self.paths.events):
                    self._events.emit("run_end", step=self._step or 0, status=final, reason=why + self.failures.summary())
        if self.owned and self.rank == 0:
            from mt.ownrun import record_end
            with self.failures.guard(self.paths.status):
                record_end(self.paths, final, why + self.failures.summary())

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """The `with` block ended: `finish()`, or `failed` naming the exception, which goes on up."""
        if exc is None or isinstance(exc, SystemExit) and exc.code in (0, None):
            self.finish()
        else:
            self.finish("failed", failure_reason(self.rank, type(exc), exc))

    # ---- machinery ----------------------------------------------------------------------
    # Right after a training step the interpreter runs cold (an empty call costs ~7 µs there, 0.1 µs
    # hot), so the two halves of a step are flat: conversions are called only for what is not a
    # plain number, and the common step (one rank, nothing asked, no poll due) asks no one.
    def _sync(self, step: int, tokens: Any) -> tuple[Control, float | None]:
        """The part of a step every rank does: heartbeat, control (rank 0), the agreement."""
        if type(step) is not int or step < 0 or step >= _WHOLE_MAX:
            step = as_whole(step, "step")
        if tokens is not None and not ((type(tokens) is int or type(tokens) is float) and 0 <= tokens < _WHOLE_MAX):
            tokens = as_number(tokens, "tokens", nonneg=True, finite=True)
        self._heartbeat.note(step)
        if self._agree.alone and self._signals.received is None and not self._asked:
            ctl = _GO
        else:
            ctl, tokens = self._decide(step, tokens)
        if not self._started:
            self._ensure_started(step - 1)
        self._step = step
        return ctl, tokens

    def _emit_step(self, step: int, dt: float | None, n: int, loss: float | None, lr: float | None,
                   grad_norm: float | None, tokens: float | None, extra: Mapping[str, float] | None,
                   epoch: float | None = None) -> None:
        """Rank 0: note the step (values already checked; `dt` the time of the `n` steps it closes) for the
        next batched write; other ranks write nothing."""
        if self._events is None:
            return
        if not self._started:
            self._ensure_started(step - 1)
        if tokens is None and self.facts.tokens_per_step is not None:
            tokens = float(self.facts.tokens_per_step * n)  # the script said how many a step has
        self._steps.note((step, time.time(), dt, loss, lr, grad_norm, tokens, extra, n, epoch))

    def _decide(self, step: int, tokens: float | None) -> tuple[Control, float | None]:
        """Control (rank 0) and the agreement of every rank: checkpoint now, stop, tokens summed."""
        ckpt = stop = False
        if self._asked:
            with self._lock:
                asked, self._asked = self._asked, []
            self._pending += asked
            ckpt = any(r.action == "checkpoint" for r in asked)
            stop = any(r.action == "stop" for r in asked)
        ckpt, stop, tokens_all = self._agree.decide(ckpt, stop or self._signals.received is not None, tokens)
        if not (ckpt or stop):
            return _GO, tokens_all
        if stop and self._stopping is None:
            self._stopping = f"{self._signals.name} received" if self._signals.received else "stop requested"
        self._heartbeat.note(step, "checkpoint")  # a long save is explained, not taken for a hang
        return Control(checkpoint=ckpt, stop=stop), tokens_all

    def _tick(self) -> None:
        """Rank 0's heartbeat thread, every _TICK_S: new requests in control/ (the next step takes
        them), then the waiting step events and the rules."""
        assert self._events is not None
        with self._lock:
            if self._finished or not self._started:
                return
            polled = self._inbox.poll(_REFUSED) if self._inbox is not None else Polled()
            self._flush()  # the answers follow the steps before them
            self._asked += polled.requests  # taken even if their answers cannot be written
            with self.failures.guard(self.paths.events):
                for rid, action, why in polled.rejected:
                    self._events.emit("control", **event_fields.control_answer(rid, action, "rejected", why))
                at = (self._step or 0) + 1
                for req in polled.requests:
                    self._events.emit("control", **event_fields.accepted(req.id, req.action, at))

    def _flush(self) -> None:
        """Write the waiting step events in one go, then run the rank-0 rules over them.

        The heartbeat thread calls it every _TICK_S, so a step's own cost (the script's) is a
        note; other events call it first, so they follow the steps before them."""
        if not self._steps or self._events is None:
            return
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        assert self._events is not None
        lines, rows, fields = self._steps.drain()
        with self.failures.guard(self.paths.events):  # steps that do not fit are lost, not retried
            self._events.emit_lines(lines, rows)
            self._watch(fields)

    def _watch(self, steps: list[dict[str, Any]]) -> None:
        """The engine's own rank-0 rules (NaN, loss spike, grad explosion) on the script's numbers."""
        from mt.rules import StepRules, nan_incident

        assert self._events is not None
        if self._step_rules is None:
            from mt.contract.config import MonitorConfig
            self._step_rules = StepRules(MonitorConfig(), 0.0)
        for fields in steps:
            loss = fields["loss"]
            if loss is not None and not math.isfinite(loss):
                if not self._nan_open:
                    self._events.emit("incident", **nan_incident(fields["step"], fields["lr"] or math.nan,
                                                                 fields["grad_norm"] or math.nan, loss, [], "reported").event_fields())
                self._nan_open = True
                continue
            self._nan_open = False
            for incident in self._step_rules.observe(fields):
                self._events.emit("incident", **incident.event_fields())

    def _ensure_started(self, step: int) -> None:
        if self._events is not None and not self._started:
            self._emit_run_start(step)

    def _emit_run_start(self, start_step: int) -> None:
        assert self._events is not None
        self._started = True
        torch = sys.modules.get("torch")
        with self.failures.guard(self.paths.events):
            self._events.emit("run_start", **event_fields.run_start(
                run_id=self.dir.name, attempt=self.attempt, world_size=self.world_size,
                local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)),
                device=self.facts.device or self._agree.device_name(), backend=self._agree.backend(),
                precision=self.facts.precision, config=plain(self.config),
                params_total=self.facts.params_total, params_trainable=self.facts.params_trainable,
                tokens_per_step=self.facts.tokens_per_step, effective_batch=self.facts.effective_batch, static_mem_bytes=None,
                start_step=max(0, start_step), max_steps=self.max_steps,
                resumed_from={"path": str(self.resume_from)} if self.resume_from else None,
                torch_version=getattr(torch, "__version__", None), git_commit=None, source="script",
                script=sys.argv[0] if sys.argv else None, pid=os.getpid(),
                **({"grad_clip": self.facts.grad_clip} if self.facts.grad_clip is not None else {}),
            ))
            if self.rollback is not None:
                announce_rollback(self._events, self.rollback)

    def _describe(self, config: Mapping[str, Any] | None, facts: Facts, max_steps: int | None) -> None:
        """A later mt.init's words (an adapter's, once its framework knows them): they count until run_start is written."""
        if self._started:
            return
        if config is not None:
            self.config = dict(config)
        self.facts = facts.over(self.facts)
        self.max_steps = max_steps or self.max_steps

    def _excepthook(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        """An exception escaping the script ends the run as failed, with its type and message."""
        try:
            self.finish("failed", failure_reason(self.rank, kind, exc))
        finally:
            self._previous_hook(kind, exc, tb)

    _previous_hook = staticmethod(sys.__excepthook__)
