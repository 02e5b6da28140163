"""What an eval adds to the validation loss ([eval], docs/presets.md#eval): each prompt's continuation
(`sample` events) and the numbers of the user's own `[eval] factory(model, step)` (the eval's `metrics`).

Both run under `torch.random.fork_rng`, seeded from (run.seed, step, prompt): a resume repeats the
samples, and the training's RNG streams are as they were, so an exact resume stays exact.
Under fsdp every rank runs them (the model's forward is a collective); else rank 0 alone.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol

import torch
from torch import nn

from engine.dist import DistEnv, log
from engine.factory import UserCodeError, add_workdir, call_factory, check_args, import_callable
from engine.kinds import kind_of
from mt.contract.config import Config
from mt.contract.eventlog import EventWriter, NullEventWriter
from mt.contract.events import SAMPLE_TEXT_MAX
from mt.contract.incident import Incident


class Codec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class Bytes:
    """mt's byte-level text (data.source = "text" without a tokenizer, and the synthetic source): UTF-8 bytes."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class TokenizerFile:
    """[data] tokenizer: a `tokenizers` JSON file."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(path)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids))


class HfTokenizer:
    """An HF model's own tokenizer, from its [model.hf] path folder."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids))


_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def codec_for(cfg: Config) -> Codec:
    """The run's own tokenizer: an HF model folder's, else [data] tokenizer's file, else bytes."""
    path = kind_of(cfg).tokenizer_folder(cfg)
    if path and any(os.path.exists(os.path.join(path, f)) for f in _HF_TOKENIZER_FILES):
        return HfTokenizer(path)
    if cfg.data.tokenizer:
        where = cfg.data.tokenizer
        return TokenizerFile(where if os.path.isabs(where) else os.path.join(cfg.run.workdir or os.getcwd(), where))
    return Bytes()


def eval_factory(cfg: Config) -> Callable[..., Any]:
    """[eval] factory imported and bound to (model, step); UserCodeError names eval.factory."""
    add_workdir(cfg)
    fn = import_callable(cfg.eval.factory, "eval.factory", cfg.run.workdir)
    check_args(fn, cfg.eval.factory, "eval.factory", None, 0)
    return fn


def seed_of(seed: int, step: int, index: int) -> int:
    """The generator's seed of one prompt at one eval: the same on every attempt."""
    return ((seed * 1_000_003 + step) * 1_009 + index) % (1 << 63)


def numbers(out: Any) -> dict[str, float] | str:
    """A factory's answer as {name: number}, or what is wrong with it (one line)."""
    if not isinstance(out, dict):
        return f"returned a {type(out).__name__}, not a dict of named numbers"
    got: dict[str, float] = {}
    for k, v in out.items():
        if not isinstance(k, str) or not k:
            return f"returned a key {k!r} that is not a non-empty string"
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"returned {k!r}: {type(v).__name__}, not a number"
        got[k] = float(v)
    return got


class EvalExtras:
    """[eval] prompts and factory, run inside the Evaluator's no-grad, eval-mode pass."""

    def __init__(self, cfg: Config, env: DistEnv, model: nn.Module, events: EventWriter | NullEventWriter) -> None:
        self.cfg, self.env, self.model, self.events = cfg, env, model, events
        e = cfg.eval
        # under fsdp every rank runs the forward; under ddp (or one rank) rank 0 alone, the others wait at the eval's all_reduce
        self.here = env.is_main or cfg.train.strategy == "fsdp"
        self.codec = codec_for(cfg) if e.prompts and self.here else None
        self.fn = eval_factory(cfg) if e.factory and self.here else None
        self.prompts = [self.codec.encode(p) for p in e.prompts] if self.codec else []

    @contextmanager
    def _rng(self, seed: int) -> Iterator[None]:
        """The global RNG streams forked (restored after), seeded for this prompt."""
        devices = [self.env.device.index or 0] if self.env.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    def metrics(self, step: int) -> dict[str, float] | None:
        """The factory's numbers at this step; None (and an incident) when it raised or returned something else."""
        if self.fn is None:
            return None
        spec = self.cfg.eval.factory
        try:
            with self._rng(seed_of(self.cfg.run.seed, step, -1)):
                got = numbers(call_factory(self.fn, spec, "eval.factory", self.model, step))
        except UserCodeError as e:
            got = e.message
        if isinstance(got, str):
            self._failed(step, f"[eval] factory {spec}", got if got.startswith(spec) else f"{spec}(model, {step}) {got}")
            return None
        return got

    def samples(self, step: int) -> list[dict[str, Any]]:
        """Each prompt's continuation at this step: the `sample` events' fields."""
        out: list[dict[str, Any]] = []
        e = self.cfg.eval
        for index, (prompt, ids) in enumerate(zip(e.prompts, self.prompts)):
            try:
                with self._rng(seed_of(self.cfg.run.seed, step, index)):
                    new = self._generate(ids)
            except Exception as ex:  # noqa: BLE001 - a model's generate is not ours: the run goes on
                self._failed(step, f"sample {index}", f"generating from prompt {index} ({prompt[:40]!r}) raised {type(ex).__name__}: {ex}")
                continue
            out.append({"index": index, "prompt": prompt, "text": self.codec.decode(new)[:SAMPLE_TEXT_MAX] if self.codec else "",
                        "tokens": len(new)})
        return out

    def _generate(self, ids: list[int]) -> list[int]:
        """The new token ids after `ids`, by the model's own generate (mt's GPT, an HF model or a factory model's)."""
        e, model = self.cfg.eval, self.model
        idx = torch.tensor([ids], dtype=torch.long, device=self.env.device)
        out = kind_of(self.cfg).generate(model, idx, e.max_new_tokens, e.temperature)
        return [int(i) for i in out[0, len(ids):].tolist()]

    def _failed(self, step: int, what: str, detail: str) -> None:
        log(f"eval at step {step}: {detail}")
        self.events.emit("incident", **Incident(
            "eval_failed", "warn", step, f"{what} failed at step {step}", detail,
            "Fix it and `mt resume`: the training goes on without it meanwhile.", {"what": what}).event_fields())
