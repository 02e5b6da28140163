"""The eval: when it runs (`due`, [train] eval_every and the last step), its validation loss, and [eval]'s
samples and factory numbers (engine/samples.py)."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

from engine.data import Splits, val_batches
from engine.dist import DistEnv
from engine.parallel import Parallel
from engine.precision import Precision
from engine.samples import EvalExtras
from engine.user import call_model, loss_of, to_device
from mt.contract.config import Config
from mt.contract.eventlog import EventWriter, NullEventWriter


def eager_eval(cfg: Config) -> AbstractContextManager[Any]:
    """Eval runs the compiled blocks eager (torch.compiler.set_stance): a few no-grad batches do not
    pay for compiling graphs of their own, and the cache keeps training's graphs only, so a later
    recompile's reason is a training guard (dynamo reports the newest entry's failure), not grad mode."""
    if cfg.train.compile and hasattr(torch.compiler, "set_stance"):
        return torch.compiler.set_stance("force_eager")
    return nullcontext()


class Evaluator:
    """The mean validation loss over eval_batches micro-batches per rank, on every rank (a collective),
    and [eval]'s samples and numbers (rank 0's, or every rank's under fsdp)."""

    def __init__(self, cfg: Config, env: DistEnv, splits: Splits, par: Parallel, model: torch.nn.Module,
                 precision: Precision, what: str, events: EventWriter | NullEventWriter) -> None:
        self.cfg, self.env, self.splits, self.par, self.model, self.precision, self.what = (
            cfg, env, splits, par, model, precision, what)
        self.every = cfg.train.eval_every  # the eval_every knob's value in force (engine/knobs.py)
        self.extras = EvalExtras(cfg, env, model, events)

    def due(self, step: int) -> bool:
        """Every eval_every steps and at the last one; never without eval_every, nor with nothing to do."""
        has = self.splits.val is not None or bool(self.cfg.eval.prompts or self.cfg.eval.factory)
        return bool(self.every) and has and (step % self.every == 0 or step == self.cfg.train.max_steps)

    def run(self, step: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The eval event's fields (val_loss, null without a validation split; metrics) and the samples'."""
        fields: dict[str, Any] = {"val_loss": None}
        with eager_eval(self.cfg), torch.no_grad():
            self.par.module.eval()
            metrics = self.extras.metrics(step)
            samples = self.extras.samples(step)
            if self.splits.val is not None:  # after the extras: the other ranks wait for them in this all_reduce
                total = torch.zeros((), device=self.env.device, dtype=torch.float64)
                n = self.cfg.train.eval_batches
                for batch in val_batches(self.splits, self.cfg.train.micro_batch_size, n, self.env.rank, self.env.world_size):
                    with self.precision.autocast():
                        total += loss_of(call_model(self.model, to_device(batch, self.env.device)), self.what).double()
                dist.all_reduce(total)
                fields["val_loss"] = float(total) / (n * self.env.world_size)
            self.par.module.train()
        if metrics is not None:
            fields["metrics"] = metrics
        return fields, samples
