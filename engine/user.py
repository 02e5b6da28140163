"""Users' own code: their datasets, how their models are called and what they return, and the launch check.

`python -P -m engine.user --check` (config.json on stdin) is what `mt launch` runs to refuse a
factory that cannot be imported or called before anything starts: it prints `key<TAB>message`
and exits 2, or one JSON line (the files the answer depends on, an HF config's vocab_size).
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import sysconfig
from typing import Any, Callable

import torch
from torch import nn

from engine import exit_now, factory
from engine.factory import UserCodeError, add_workdir, call_factory, check_args, import_callable
from mt.contract.config import Config, ConfigError
from mt.contract.preset import config_from_dict


class ModelOutputError(ValueError):
    """The model returned no usable loss: a bug in the user's code, found at the first step."""


def build_dataset(cfg: Config, split: str) -> Any:
    """`[data] factory(split, **args)`: a map-style dataset (len and indexing), or None."""
    d = cfg.data
    fn = import_callable(d.factory, "data.factory", cfg.run.workdir)
    check_args(fn, d.factory, "data.args", split, **d.args)
    ds = call_factory(fn, d.factory, "data.factory", split, **d.args)
    if ds is None:
        return None
    if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise UserCodeError("data.factory", f"{d.factory}({split!r}) returned a {type(ds).__name__}, "
                                            "not a map-style dataset (it needs __len__ and __getitem__)")
    if len(ds) < 1 and split == "train":
        raise UserCodeError("data.factory", f"{d.factory}('train') returned an empty dataset")
    return ds


def call_model(model: nn.Module, batch: Any) -> Any:
    """`model(*batch)` for a tuple or list, `model(**batch)` for a dict, `model(batch)` otherwise."""
    try:
        if isinstance(batch, (tuple, list)):
            return model(*batch)
        if isinstance(batch, dict):
            return model(**batch)
        return model(batch)
    except TypeError as e:
        problem = batch_mismatch(model, batch)  # only looked for once the call failed: nothing per step
        if problem:
            raise UserCodeError("model.factory", problem) from e
        raise


def batch_mismatch(model: nn.Module, batch: Any) -> str | None:
    """Why call_model cannot pass this batch to the model's forward (None: its signature takes it)."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper, then DDP's: their forward takes anything
    inner = inner.module if isinstance(inner, nn.parallel.DistributedDataParallel) else inner
    model = getattr(inner, "_orig_mod", inner)
    forward = getattr(model, "forward", None)
    try:
        sig = inspect.signature(forward)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if isinstance(batch, dict):
        args, kwargs, how = (), batch, f"a dict with keys {sorted(map(str, batch))}, passed as keywords"
    elif isinstance(batch, (tuple, list)):
        args, kwargs, how = tuple(batch), {}, f"a {type(batch).__name__} of {len(batch)}, passed by position"
    else:
        args, kwargs, how = (batch,), {}, f"a {type(batch).__name__}, passed as one argument"
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        name = type(model).__name__
        return (f"each batch is {how}, but {name}.forward{sig} does not take it ({e}); return samples"
                " that match forward's parameters (a dict for keyword ones, a tuple for positional-only ones)")
    return None


def loss_of(out: Any, what: str) -> torch.Tensor:
    """The scalar loss in what a model returned: a tensor, `.loss` (a ModelOutput) or `["loss"]`."""
    loss = out
    if not isinstance(out, torch.Tensor):
        loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.reshape(())
    shape = f" of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else ""
    raise ModelOutputError(f"{what} returned a {type(out).__name__}{shape}; expected a scalar loss "
                           "tensor, an object with .loss, or a dict with \"loss\"")


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`fn` applied to every tensor in nested tuples, lists and dicts; other leaves kept as they are."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


def to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor in a batch moved to `device`."""
    return map_tensors(batch, lambda t: t.to(device, non_blocking=True))


def pin_batches(sample: Any, device: torch.device) -> bool:
    """Whether the loader pins its batches: only for a CUDA run whose samples are CPU tensors (pinning a
    dataset's CUDA tensors fails: they are on the device already)."""
    found: list[torch.Tensor] = []
    map_tensors(sample, found.append)
    return device.type == "cuda" and bool(found) and all(t.device.type == "cpu" for t in found)


def tokens_per_sample(sample: Any) -> int | None:
    """A sample's token count: its `input_ids`, else its first integer tensor (None: no tokens)."""
    if isinstance(sample, dict) and isinstance(sample.get("input_ids"), torch.Tensor):
        return int(sample["input_ids"].numel())
    found: list[torch.Tensor] = []
    map_tensors(sample, found.append)
    for t in found:
        if not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool and t.dim() >= 1:
            return int(t.numel())
    return None


def check(cfg: Config) -> dict[str, Any]:
    """What `mt launch` wants known before it starts: every factory imports, takes its args and
    returns what it should, and the model takes a sample the way call_model passes it.

    Returns the files the answer depends on (for the CLI's cache) and an HF config's vocab_size."""
    before = set(sys.modules)
    add_workdir(cfg)
    from engine.kinds import kind_of  # imported here: the kinds' modules (and what they import) are files the check rests on
    found = kind_of(cfg).check(cfg)
    sample = _first_sample(cfg) if cfg.data.source == "python" else None
    if cfg.data.collate:
        fn = import_callable(cfg.data.collate, "data.collate", cfg.run.workdir)
        check_args(fn, cfg.data.collate, "data.collate", [])
    elif found.model is not None and sample is not None and (problem := batch_mismatch(found.model, sample)):
        raise UserCodeError("model.factory", problem)  # the default collate keeps a sample's dict or tuple
    if cfg.eval.factory:
        from engine.samples import eval_factory
        eval_factory(cfg)  # imports and binds (model, step)
    modules = [sys.modules[m] for m in set(sys.modules) - before]
    return {"files": depends_on(modules) + found.files, "model_vocab": found.vocab}


def _first_sample(cfg: Config) -> Any:
    ds = build_dataset(cfg, "train")
    try:
        return ds[0]
    except Exception as e:  # whatever the user's dataset raises is theirs to fix
        raise UserCodeError("data.factory", f"{cfg.data.factory}('train')[0] raised {type(e).__name__}: {e}") from e


def depends_on(modules: list[Any]) -> list[str]:
    """The source files a passed check rests on: the user's own modules, one file per installed
    package (an upgrade rewrites its __init__), torch's, and this checker's own."""
    installed = tuple(p + os.sep for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages"))
    stdlib = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib")})
    files = {__file__, factory.__file__, torch.__file__}
    for mod in modules:
        path = getattr(mod, "__file__", None)
        if not isinstance(path, str):
            continue
        if path.startswith(installed):
            path = getattr(sys.modules.get(mod.__name__.partition(".")[0]), "__file__", None) or path
        elif path.startswith(stdlib):
            continue
        files.add(path)
    return sorted(files)


def main() -> int:
    if sys.argv[1:] != ["--check"]:
        print("usage: python -m engine.user --check < config.json", file=sys.stderr)
        return 2
    try:
        passed = check(config_from_dict(json.loads(sys.stdin.read()), "config.json"))
    except UserCodeError as e:
        print(f"{e.key}\t{e.message}")
        return 2
    except ConfigError as e:
        print(f"{e.key}\t{e.message}")
        return 2
    print(json.dumps(passed))
    return 0


if __name__ == "__main__":
    exit_now(main())
