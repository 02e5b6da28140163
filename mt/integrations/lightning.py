"""PyTorch Lightning under mt: `Trainer(..., callbacks=[cb])`, then `trainer.fit(model, ckpt_path=cb.resume_from)`.

Each optimizer step's loss, lr and logged numbers go to the dashboard; `c` / `mt ckpt` save with
the Trainer's own `save_checkpoint` at the next batch end on every rank, `s` / `mt stop` / SIGTERM
save and set `should_stop`; every save is reported, so `cb.resume_from` is the newest. docs/library.md.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:
    # one line naming the fix, not a traceback of lightning's own imports
    raise ImportError('mt.integrations.lightning needs PyTorch Lightning: pip install -e ".[lightning]" (or pip install lightning)') from None

import mt
from mt.integrations.lazyrun import LazyRun
from mt.run import ENV_RUN_DIR

_OWN = ("loss", "lr", "grad_norm", "tokens", "step")  # a step's own fields, and run.step's keywords
_LOSS = ("loss", "train_loss", "train/loss")  # where a script that returns no loss logged it
_EVAL = ("val", "test")  # kept from step events: the last eval's value lingers in callback_metrics


def _number(value: Any) -> float | None:
    """A plain float from a Python number or a one-element tensor, else None (a string, a vector)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    numel = getattr(value, "numel", None)
    if numel is not None and numel() == 1:
        return float(value.detach().item())
    return None


class MtCallback(LazyRun, Callback):
    """Reports a Lightning Trainer to mt and obeys mt's checkpoint and stop requests (on every rank).

    `dirpath`: where the requested checkpoints go (default `<run dir>/ckpt`), `step<N>.ckpt` each."""

    def __init__(self, run: mt.Run | None = None, dirpath: str | Path | None = None) -> None:
        super().__init__(run)
        self._dirpath = Path(dirpath) if dirpath is not None else None
        self._last: int | None = None  # the global step last reported: accumulating batches make none

    @property
    def resume_from(self) -> str | None:
        """The newest checkpoint an earlier attempt reported, for `trainer.fit(..., ckpt_path=...)`."""
        if self._run is None and not os.environ.get(ENV_RUN_DIR):
            # a run mt.init makes itself has no earlier attempt, and under torchrun it is made only
            # once fit has a process group (setup): asking now would be too early
            return None
        return super().resume_from

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # before fit registers Lightning's SIGTERM handler, which then calls mt's as well
        self.run

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        run = self.run
        hparams = dict(getattr(pl_module, "hparams", None) or {})
        run.config = {k: v for k, v in hparams.items() if isinstance(v, (str, int, float, bool)) or v is None}
        run.max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)  # optimizer steps done, this one included: a resumed fit goes on at saved + 1
        if step == self._last:
            return  # an accumulating batch: no optimizer step, no step event, no agreement
        self._last = step
        metrics = {str(k): _number(v) for k, v in trainer.callback_metrics.items()}
        loss = _number(outputs.get("loss") if isinstance(outputs, dict) else outputs)
        if loss is None:
            loss = next((metrics[k] for k in _LOSS if metrics.get(k) is not None), None)
        extra = {k: v for k, v in metrics.items()
                 if v is not None and k not in (*_OWN, *_LOSS) and not k.startswith(_EVAL) and not k.endswith("_epoch")}
        optimizers = trainer.optimizers
        lr = _number(optimizers[0].param_groups[0].get("lr")) if optimizers else None
        extra.pop("epoch", None)   # a logged epoch is Lightning's own count: the step's epoch below
        ctl = self.run.step(step, loss=loss, lr=lr, epoch=trainer.current_epoch, **extra)  # every rank: one agreement
        if ctl.checkpoint or ctl.stop:
            self._save(trainer, step)
        if ctl.stop:
            trainer.should_stop = True

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        values = {str(k): n for k, v in trainer.callback_metrics.items() if str(k).startswith("val") and (n := _number(v)) is not None}
        if values:
            self.run.log(values, step=int(trainer.global_step))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.run.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # Lightning ends a fit on SIGTERM by raising SIGTERMException (a SystemExit) after the batch
        # that saved: a stop, not a failure. Other exceptions reach mt's exception hook as they are.
        if isinstance(exception, SystemExit):
            self.run.finish("stopped")

    def _save(self, trainer: Any, step: int) -> None:
        """The Trainer's own checkpoint (collective under DDP: rank 0 writes), then reported."""
        path = (self._dirpath or self.run.dir / "ckpt") / f"step{step}.ckpt"
        trainer.save_checkpoint(path)
        self.run.checkpoint_saved(path, step)
