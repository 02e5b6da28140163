"""What the engine asks of a `[model] kind`: the protocol each kind's object answers, and the search
for blocks by class name that two kinds share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from engine.factory import UserCodeError
from mt.contract.config import Config


@dataclass
class Checked:
    """What a kind's launch check found: a model to try a sample on, its config's vocab_size, the files it read."""

    model: nn.Module | None = None
    vocab: int | None = None
    files: list[str] = field(default_factory=list)


class ModelKind(Protocol):
    """One per `[model] kind` (engine/kinds/<kind>.py); the only place that knows what a kind is."""

    # under fsdp the ranks but 0 may build it on the meta device and receive rank 0's values
    meta_build: bool
    # flops_per_token is the model's exact count; else an estimate torch's counter replaces at the first step
    exact_flops: bool
    # a release is the model's own save_pretrained folder (HF); else its state dict as model.safetensors
    saves_pretrained: bool

    def build(self, cfg: Config) -> nn.Module:
        """The model, on the default device (the meta device inside the caller's `torch.device("meta")`)."""
        ...

    def blocks(self, model: nn.Module, cfg: Config) -> list[nn.Module]:
        """The repeated blocks fsdp shards, activation checkpointing recomputes and compile compiles ([]: none named)."""
        ...

    def vocab(self, cfg: Config) -> tuple[int, str]:
        """The vocabulary mt's token ids must fit, and the preset key that sets it."""
        ...

    def samples(self, windows: Any) -> Any:
        """mt's token windows ((x, y), index) as this kind's model takes them."""
        ...

    def flops_per_token(self, cfg: Config, n_params: int) -> float:
        """Training FLOPs per token, for MFU (an estimate where not exact_flops)."""
        ...

    def describe(self, cfg: Config) -> str:
        """The model's name in a run_end that says what it returned."""
        ...

    def check(self, cfg: Config) -> Checked:
        """What `mt launch` checks of the model before anything starts (UserCodeError names the key)."""
        ...

    def generate(self, model: nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float) -> torch.Tensor:
        """`idx` followed by the model's new tokens ([eval] prompts; temperature 0: greedy)."""
        ...

    def tokenizer_folder(self, cfg: Config) -> str:
        """A folder with the model's own tokenizer files, or "" (samples decode with it first)."""
        ...


def own_generate(model: nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float) -> torch.Tensor:
    """mt's GPT's or a factory model's own `generate(idx, max_new_tokens, temperature=...)`."""
    gen = getattr(model, "generate", None)
    if not callable(gen):
        raise TypeError(f"{type(model).__name__} has no generate(idx, max_new_tokens, temperature)")
    return gen(idx, max_new_tokens, temperature=temperature)


def blocks_named(model: nn.Module, names: set[str], key: str) -> list[nn.Module]:
    """The submodules whose class is one of `names`; none is a UserCodeError on `key` listing the model's classes."""
    found = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if not found:
        what = f"no module of class {', '.join(sorted(names))}" if names else "no _no_split_modules to shard by"
        raise UserCodeError(key, f"{what} in {type(model).__name__} (its classes: {_classes(model)})")
    return found


def _classes(model: nn.Module) -> str:
    seen = list(dict.fromkeys(type(m).__name__ for m in model.modules()))
    return ", ".join(seen[:12]) + (" ..." if len(seen) > 12 else "")
