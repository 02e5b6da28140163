"""What a script says about its run at `mt.init(...)`: precision, device, batch, clip (the header's facts).

The engine knows these from its preset; a script (or a framework's adapter: the Hugging Face
Trainer's arguments and model) says them, else the header shows N/A. Checked at the call: a wrong value is
the script's own error (TypeError / ValueError naming it). docs/library.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mt.values import as_number, as_whole


@dataclass(frozen=True)
class Facts:
    """The run_start fields a script may state; None: not said."""

    precision: str | None = None        # "bf16", "fp16", "fp32", ...
    device: str | None = None           # what the header names: "cpu", or a GPU's name (else mt asks CUDA)
    effective_batch: int | None = None  # samples per optimizer step over every rank (micro batch x accumulation x world)
    tokens_per_step: int | None = None  # tokens per optimizer step over every rank
    grad_clip: float | None = None      # the clip norm: the grad-norm plot's red line
    params_total: int | None = None     # the model's parameters, and those the optimizer trains (fewer: LoRA)
    params_trainable: int | None = None

    @staticmethod
    def of(**said: Any) -> Facts:
        """The facts as given, each checked (text, a whole number > 0, a number > 0)."""
        out: dict[str, Any] = {}
        for name in ("precision", "device"):
            v = said.get(name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise TypeError(f"mt: {name} must be non-empty text, got {type(v).__name__} {v!r:.40}")
            out[name] = v.strip() if v is not None else None
        for name in ("effective_batch", "tokens_per_step"):
            v = said.get(name)
            out[name] = None if v is None else as_whole(v, name)
            if out[name] == 0:
                raise ValueError(f"mt: {name} must be > 0, got 0")
        for name in ("params_total", "params_trainable"):
            v = said.get(name)
            out[name] = None if v is None else as_whole(v, name)
        if out["params_trainable"] is not None and out["params_total"] is not None and out["params_trainable"] > out["params_total"]:
            raise ValueError(f"mt: params_trainable {out['params_trainable']} is more than params_total {out['params_total']}")
        clip = as_number(said.get("grad_clip"), "grad_clip", nonneg=True, finite=True)
        out["grad_clip"] = clip if clip else None  # 0: no clipping, no line
        return Facts(**out)

    def over(self, older: Facts) -> Facts:
        """These facts, with what `older` said where these say nothing."""
        return Facts(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(older, f.name)
                        for f in dataclasses.fields(self)})
