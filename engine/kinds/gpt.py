"""`[model] kind = "gpt"`: mt's own GPT (engine/model.py)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.kinds.base import Checked, own_generate
from engine.model import GPT, flops_per_token
from mt.contract.config import Config


class GptKind:
    meta_build = True
    exact_flops = True
    saves_pretrained = False

    def build(self, cfg: Config) -> nn.Module:
        return GPT(cfg.model)

    def blocks(self, model: nn.Module, cfg: Config) -> list[nn.Module]:
        return list(model.blocks)  # type: ignore[arg-type]

    def vocab(self, cfg: Config) -> tuple[int, str]:
        return cfg.model.vocab_size, "model.vocab_size"

    def samples(self, windows: Any) -> Any:
        return windows  # GPT.forward(idx, targets)

    def flops_per_token(self, cfg: Config, n_params: int) -> float:
        return flops_per_token(cfg.model, n_params)  # exact, with the attention term

    def describe(self, cfg: Config) -> str:
        return "the GPT"

    def check(self, cfg: Config) -> Checked:
        return Checked()  # mt/contract/preset.py checked its shape

    def generate(self, model: nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float) -> torch.Tensor:
        return own_generate(model, idx, max_new_tokens, temperature)

    def tokenizer_folder(self, cfg: Config) -> str:
        return ""
