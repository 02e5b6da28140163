"""Hugging Face `Trainer` under mt: `Trainer(..., callbacks=[MtCallback()])`.

Loss, learning rate, grad norm, the fractional epoch and tokens (TRL's `num_tokens`) go to the dashboard,
with the model's parameters and those that train (a peft adapter's); `c` / `mt ckpt` set `should_save`, `s` /
`mt stop` / SIGTERM set `should_save` and `should_training_stop`; every folder the Trainer saves
is reported, so a resumed attempt continues with `trainer.train(resume_from_checkpoint=cb.resume_from)`.
"""
from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

import mt
from mt.integrations.lazyrun import LazyRun

_SKIP = ("epoch", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
         "num_tokens", "num_input_tokens_seen")  # the token counts are the step's `tokens`
_COUNTS = ("num_tokens", "num_input_tokens_seen")  # TRL's, and the Trainer's with include_num_input_tokens_seen: totals so far
_OWN = ("loss", "learning_rate", "grad_norm", "step", "lr", "tokens")  # a step's own fields, and run.record's keywords


class MtCallback(LazyRun, TrainerCallback):
    """Reports a Trainer to mt and obeys mt's checkpoint and stop requests (on every rank).

    `resume_from`: the newest checkpoint folder, for `trainer.train(resume_from_checkpoint=...)`."""

    _tokens: float | None = None  # the token total the previous log said (this attempt)
    _tokens_at_start = 0.0        # the Trainer's own total where this attempt began (restored on resume)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # what the Trainer knows goes into run_start (written at the first step): the header's facts, and
        # its arguments as the run's config (`mt diff` compares them)
        device = getattr(args, "device", None)
        self._tokens_at_start = getattr(state, "num_input_tokens_seen", 0) or 0
        params = list(kwargs["model"].parameters()) if kwargs.get("model") is not None else None
        self._run = mt.init(
            config={k: v for k, v in args.to_dict().items() if isinstance(v, (str, int, float, bool)) or v is None},
            max_steps=state.max_steps or None, precision=precision_of(args),
            device=None if device is None or device.type == "cuda" else device.type,  # a GPU: mt asks CUDA its name
            effective_batch=args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            grad_clip=args.max_grad_norm or None,
            # a peft (LoRA) model trains a few of them: the header says how many of how many
            params_total=sum(p.numel() for p in params) if params else None,
            params_trainable=sum(p.numel() for p in params if p.requires_grad) if params else None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # every rank, every optimizer step: heartbeat and agreement; the numbers come with on_log
        ctl = self.run.sync(state.global_step)
        if ctl.checkpoint or ctl.stop:
            control.should_save = True
        if ctl.stop:
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "eval_loss" in logs:
            values = {("val_loss" if k == "eval_loss" else k): v for k, v in logs.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "epoch"}
            self.run.log(values, step=state.global_step)
            return
        if "loss" not in logs:
            return  # the end-of-training summary
        extra = {k: v for k, v in logs.items()
                 if k not in (*_SKIP, *_OWN) and isinstance(v, (int, float)) and not isinstance(v, bool)}
        key = next((k for k in _COUNTS if isinstance(logs.get(k), (int, float))), None)
        total = logs[key] if key else getattr(state, "num_input_tokens_seen", None) or None
        # the first log of an attempt counts from where the total began: TRL's num_tokens from 0 in each
        # process, the Trainer's from what its checkpoint restored
        before = self._tokens if self._tokens is not None else 0 if key == "num_tokens" else self._tokens_at_start
        tokens = total - before if total is not None and total >= before else None
        self._tokens = total
        epoch = logs.get("epoch", getattr(state, "epoch", None))   # the Trainer's fractional epoch (1.25)
        self.run.record(state.global_step, loss=logs.get("loss"), lr=logs.get("learning_rate"), grad_norm=logs.get("grad_norm"),
                        tokens=tokens, epoch=epoch if isinstance(epoch, (int, float)) and epoch >= 0 else None, **extra)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.checkpoint_saved(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"), state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.finish()


def precision_of(args: Any) -> str:
    """The Trainer's training precision, as the engine names it."""
    return "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"
