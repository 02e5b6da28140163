"""Validation loss: when it runs (`due`, [train] eval_every and the last step) and the run itself."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

from engine.data import Splits, val_batches
from engine.dist import DistEnv
from engine.parallel import Parallel
from engine.precision import Precision
from engine.user import call_model, loss_of, to_device
from mt.contract.config import Config


def eager_eval(cfg: Config) -> AbstractContextManager[Any]:
    """Eval runs the compiled blocks eager (torch.compiler.set_stance): a few no-grad batches do not
    pay for compiling graphs of their own, and the cache keeps training's graphs only, so a later
    recompile's reason is a training guard (dynamo reports the newest entry's failure), not grad mode."""
    if cfg.train.compile and hasattr(torch.compiler, "set_stance"):
        return torch.compiler.set_stance("force_eager")
    return nullcontext()


class Evaluator:
    """The mean validation loss over eval_batches micro-batches per rank, on every rank (a collective)."""

    def __init__(self, cfg: Config, env: DistEnv, splits: Splits, par: Parallel, model: torch.nn.Module,
                 precision: Precision, what: str) -> None:
        self.cfg, self.env, self.splits, self.par, self.model, self.precision, self.what = (
            cfg, env, splits, par, model, precision, what)
        self.every = cfg.train.eval_every  # the eval_every knob's value in force (engine/knobs.py)

    def due(self, step: int) -> bool:
        """Every eval_every steps and at the last one; never without eval_every or a validation split."""
        every = self.every
        return bool(every) and self.splits.val is not None and (step % every == 0 or step == self.cfg.train.max_steps)

    def run(self) -> float:
        with eager_eval(self.cfg), torch.no_grad():
            self.par.module.eval()
            total = torch.zeros((), device=self.env.device, dtype=torch.float64)
            n = self.cfg.train.eval_batches
            for batch in val_batches(self.splits, self.cfg.train.micro_batch_size, n, self.env.rank, self.env.world_size):
                with self.precision.autocast():
                    total += loss_of(call_model(self.model, to_device(batch, self.env.device)), self.what).double()
            dist.all_reduce(total)
            self.par.module.train()
        return float(total) / (n * self.env.world_size)
