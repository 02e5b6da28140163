"""Model kinds: one object per `[model] kind` answers everything the engine asks about its model
(engine/kinds/base.py `ModelKind`); a new kind is one file here and one line below."""
from __future__ import annotations

from engine.kinds.base import ModelKind
from engine.kinds.gpt import GptKind
from engine.kinds.hf import HfKind
from engine.kinds.python import PythonKind
from mt.contract.config import Config


def kind_of(cfg: Config) -> ModelKind:
    """The preset's kind (mt/contract/preset.py has refused any other name)."""
    kinds: dict[str, ModelKind] = {"gpt": GptKind(), "python": PythonKind(), "hf": HfKind()}
    return kinds[cfg.model.kind]
