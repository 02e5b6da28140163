"""`[model] kind = "python"`: the model a user's `[model] factory(**args)` returns."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.factory import UserCodeError, call_factory, check_args, import_callable
from engine.kinds.base import Checked, blocks_named, own_generate
from mt.contract.config import Config


class PythonKind:
    meta_build = False  # a factory's own code may need real tensors: every rank builds it
    exact_flops = False  # counted by torch at the first step (engine/metrics.py FlopCount)
    saves_pretrained = False

    def build(self, cfg: Config) -> nn.Module:
        return build_model(cfg)

    def blocks(self, model: nn.Module, cfg: Config) -> list[nn.Module]:
        wrap = cfg.train.fsdp.wrap  # mt/contract/preset.py requires it for fsdp and activation checkpointing
        return blocks_named(model, set(wrap), "train.fsdp.wrap") if wrap else []

    def vocab(self, cfg: Config) -> tuple[int, str]:
        return cfg.model.vocab_size, "model.vocab_size"

    def samples(self, windows: Any) -> Any:
        return windows  # model(x, y)

    def flops_per_token(self, cfg: Config, n_params: int) -> float:
        return 6.0 * n_params  # the usual estimate (the architecture is unknown), until torch counts the first step

    def describe(self, cfg: Config) -> str:
        return f"{cfg.model.factory}(...)"

    def check(self, cfg: Config) -> Checked:
        """The factory's model on the meta device (no memory, no init); on the CPU for a factory that
        needs real tensors, whose error then is the one to report."""
        try:
            with torch.device("meta"):
                return Checked(model=build_model(cfg))
        except UserCodeError:
            return Checked(model=build_model(cfg))

    def generate(self, model: nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float) -> torch.Tensor:
        return own_generate(model, idx, max_new_tokens, temperature)

    def tokenizer_folder(self, cfg: Config) -> str:
        return ""


def build_model(cfg: Config) -> nn.Module:
    """`[model] factory(**args)`, checked to be an nn.Module."""
    m = cfg.model
    fn = import_callable(m.factory, "model.factory", cfg.run.workdir)
    check_args(fn, m.factory, "model.args", **m.args)
    model = call_factory(fn, m.factory, "model.factory", **m.args)
    if not isinstance(model, nn.Module):
        raise UserCodeError("model.factory", f"{m.factory} returned a {type(model).__name__}, not a torch.nn.Module")
    return model
