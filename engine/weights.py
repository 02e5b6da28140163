"""`[model] init_from`: start a fresh run (step 0, new optimizer) from weights trained before."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from mt.contract import checkpoints, door
from mt.contract.paths import RunPaths


class InitFromError(ValueError):
    """Weights that cannot be loaded into this model; the message names the path and the key."""


def read_state(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The state dict `path` holds, and which file it came from.

    A run directory gives its newest intact checkpoint; a checkpoint folder its model.pt (sharded:
    the model's shards, read whole); a
    `.safetensors` file is read with safetensors; anything else as a weights-only torch file.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise InitFromError(f"model.init_from: no such file or run directory: {path}")
    if path.is_dir():
        found = checkpoints.newest(RunPaths(path).checkpoints) if RunPaths(path).checkpoints.is_dir() else None
        if found is not None and found.path is None:
            raise InitFromError(f"model.init_from: {path}: the run has no intact checkpoint")
        try:
            folder, manifest = (found.path, found.manifest) if found else (path, checkpoints.verify(path))
        except checkpoints.CheckpointError as e:
            raise InitFromError(f"model.init_from: {e}") from None
        if manifest["layout"] == "sharded":  # every shard read whole, here (no collective)
            from engine.checkpoint import sharded
            try:
                return sharded.model_state(folder), str(folder)
            except checkpoints.CheckpointError as e:
                raise InitFromError(f"model.init_from: {e}") from None
        return _torch_load(folder / "model.pt"), str(folder / "model.pt")
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise InitFromError(f"model.init_from: {path}: reading .safetensors needs the hf extra "
                                "(pip install -e \".[hf]\")") from None
        try:
            return load_file(str(path)), str(path)
        except Exception as e:  # noqa: BLE001 - a damaged file raises one of several types
            raise InitFromError(f"model.init_from: {path}: not a readable safetensors file: {e}") from None
    return _torch_load(path), str(path)


def _torch_load(path: Path) -> dict[str, torch.Tensor]:
    try:
        with door.open_file(path, follow=True) as f:     # the user's own file: a link is theirs to make
            state: Any = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - weights_only refuses pickled code, and a bad file raises many types
        raise InitFromError(f"model.init_from: {path}: not a weights-only state dict: {type(e).__name__}: {e}") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]            # a common training-script layout: {"model": ..., "optimizer": ...}
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InitFromError(f"model.init_from: {path}: not a state dict (a mapping of names to tensors)")
    return state


def load_into(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy `state` into `model`; refuses naming the first missing key, unexpected key and shape mismatch."""
    problems = fit_problems(model, state, "the file")
    if problems:
        raise InitFromError(f"model.init_from: {source} does not fit the model: {'; '.join(problems)}")
    if not any(p.is_meta for p in model.parameters()):  # a meta model (fsdp, ranks but 0) gets rank 0's values
        model.load_state_dict(state)


def fit_problems(model: nn.Module, state: dict[str, torch.Tensor], where: str) -> list[str]:
    """Why `state` cannot be loaded into `model`: the first missing key, unexpected key and shape
    mismatch, each with a count of the others (torch's own message is cut to its first line)."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [(k, tuple(state[k].shape), tuple(v.shape)) for k, v in own.items() if k in state and state[k].shape != v.shape]
    problems = []
    if missing:
        problems.append(f"missing key {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if unexpected:
        problems.append(f"unexpected key {unexpected[0]!r}" + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
    if shapes:
        k, theirs, ours = shapes[0]
        more = f" (and {len(shapes) - 1} more)" if len(shapes) > 1 else ""
        problems.append(f"shape mismatch for {k!r}: {list(theirs)} in {where}, {list(ours)} in the model{more}")
    return problems
