"""Mirrors of a run into the tools people already use (TensorBoard, W&B), and `mt export`.

Everything here reads the run directory through the one typed parser (mt/contract/records.py)
and runs in the supervisor or the CLI, never in a training process. The optional packages
(tensorboard, wandb, pyarrow) are imported only where they are used. docs/run-directory.md#mirrors.
"""
from __future__ import annotations

import importlib.util

from mt.contract.config import Config, ConfigError

EXTRAS = {"tensorboard": "tensorboard", "pyarrow": "parquet", "wandb": "wandb", "apprise": "notify"}  # module -> the extra that installs it


def missing_extra(module: str) -> bool:
    """Whether an optional package cannot be imported here (looked up, not imported: no cost)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def extra_hint(module: str) -> str:
    return f"needs the {EXTRAS[module]} extra, which is not installed (pip install \"mt[{EXTRAS[module]}]\")"


def check_extras(cfg: Config, source: str) -> None:
    """A [monitor] mirror or notify whose package is missing, or a notify URL apprise refuses, is refused at
    launch, naming the key (and the extra)."""
    if cfg.monitor.tensorboard and missing_extra("tensorboard"):
        raise ConfigError(source, "monitor.tensorboard", extra_hint("tensorboard"))
    if cfg.monitor.wandb:
        from tui.mirror.wandbsink import check_wandb

        check_wandb(cfg.monitor.wandb, source)
        if missing_extra("wandb"):
            raise ConfigError(source, "monitor.wandb", extra_hint("wandb"))
    if cfg.monitor.notify:   # apprise parses each URL now: a bad one is refused before anything starts
        from tui.mirror.sender import instantiate

        try:
            instantiate(cfg.monitor.notify, source)
        except ImportError:
            raise ConfigError(source, "monitor.notify", extra_hint("apprise")) from None
