"""`[model] kind = "hf"`: a transformers causal LM built from a local config, never from the hub."""
from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from engine.factory import UserCodeError
from engine.kinds.base import Checked, blocks_named
from mt.contract.config import HF_OFFLINE, Config


class HfKind:
    meta_build = True
    exact_flops = False  # counted by torch at the first step (engine/metrics.py FlopCount)
    saves_pretrained = True

    def build(self, cfg: Config) -> nn.Module:
        return build_hf_model(cfg)

    def blocks(self, model: nn.Module, cfg: Config) -> list[nn.Module]:
        return blocks_named(model, set(getattr(model, "_no_split_modules", None) or ()), "model.hf")  # its decoder layers

    def vocab(self, cfg: Config) -> tuple[int, str]:
        return int(hf_config(cfg).vocab_size), "the model's vocab_size ([model.hf])"

    def samples(self, windows: Any) -> Any:
        return CausalLM(windows)

    def flops_per_token(self, cfg: Config, n_params: int) -> float:
        return 6.0 * n_params  # the usual estimate, until torch counts the first step

    def describe(self, cfg: Config) -> str:
        return f"the Hugging Face {cfg.model.hf.get('model_type') or 'model'}"

    def check(self, cfg: Config) -> Checked:
        vocab, files = check_hf(cfg)
        return Checked(vocab=vocab, files=files)

    def generate(self, model: nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float) -> torch.Tensor:
        sampled = temperature > 0
        pad = getattr(model.config, "eos_token_id", None)
        return model.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=max_new_tokens,  # type: ignore[operator]
                              do_sample=sampled, temperature=temperature if sampled else None, top_k=None,
                              top_p=None, pad_token_id=pad if isinstance(pad, int) else 0, use_cache=True)

    def tokenizer_folder(self, cfg: Config) -> str:
        return str(cfg.model.hf.get("path") or "")


class CausalLM(Dataset):
    """Token windows as a Hugging Face causal LM takes them: input_ids and labels (it shifts them)."""

    def __init__(self, windows: Any) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, key: int | tuple[int, float]) -> tuple[dict[str, torch.Tensor], int]:
        (x, _), i = self.windows[key]
        return {"input_ids": x, "labels": x}, i


def _transformers() -> Any:
    os.environ.update(HF_OFFLINE)
    try:
        import transformers
    except ImportError:
        raise UserCodeError("model.kind", "\"hf\" needs the hf extra: pip install -e \".[hf]\" (transformers)") from None
    transformers.logging.set_verbosity_error()  # its advice about unused weights is noise in a rank log
    return transformers


def hf_config(cfg: Config) -> Any:
    """The model's transformers config: `AutoConfig.for_model(model_type, **rest)` or a local folder's."""
    tf = _transformers()
    spec = dict(cfg.model.hf)
    path = spec.pop("path", "")
    try:
        if path:
            config = tf.AutoConfig.from_pretrained(path, local_files_only=True)
        else:
            config = tf.AutoConfig.for_model(spec.pop("model_type"), **spec)
    except (ValueError, KeyError, OSError, TypeError) as e:
        key = "model.hf.path" if path else "model.hf.model_type"
        raise UserCodeError(key, f"transformers cannot build this config: {str(e).splitlines()[0][:300]}") from None
    config.use_cache = False  # training: no key/value cache to keep
    return config


def max_positions(config: Any) -> int | None:
    """The longest sequence the model takes (None: no such limit in its config)."""
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def build_hf_model(cfg: Config) -> nn.Module:
    """The causal LM: random weights from the config, or the local folder's weights."""
    tf = _transformers()
    config = hf_config(cfg)
    path = cfg.model.hf.get("path")
    try:
        if path:
            return tf.AutoModelForCausalLM.from_pretrained(path, config=config, local_files_only=True)
        return tf.AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, OSError) as e:
        raise UserCodeError("model.hf", f"transformers cannot build a causal LM from it: {str(e).splitlines()[0][:300]}") from None


def check_hf(cfg: Config) -> tuple[int | None, list[str]]:
    """What `mt launch` checks before it starts: the config builds, and the windows fit the model.

    Returns the config's vocab_size (the launch checks a tokenizer against it) and the file it was read from."""
    config = hf_config(cfg)
    limit = max_positions(config)
    if limit is not None and cfg.model.seq_len > limit:
        raise UserCodeError("model.seq_len", f"{cfg.model.seq_len} is longer than the model's {limit} positions")
    vocab = getattr(config, "vocab_size", None)
    if cfg.data.source == "text" and not cfg.data.tokenizer and isinstance(vocab, int) and vocab < 256:
        raise UserCodeError("model.hf.vocab_size", f"text is read as bytes, so the vocabulary must be >= 256, got {vocab}")
    path = cfg.model.hf.get("path")
    return (vocab if isinstance(vocab, int) else None), [os.path.join(os.path.abspath(path), "config.json")] if path else []
