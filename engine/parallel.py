"""How the model is spread over the ranks: DDP, or FSDP2 (`fully_shard` of each block, then the
root); activation checkpointing and torch.compile of the same blocks; and the full state dicts
checkpoints hold.

Checkpoints stay one format under both strategies: model.pt is the whole model's state dict and
the optimizer's state is keyed by parameter number, as `Optimizer.state_dict()` keys it. Under
FSDP both are gathered (to CPU, on rank 0) through torch.distributed.checkpoint.state_dict, which
keys the optimizer by parameter name: numbered here in the optimizer's own order, so a checkpoint
resumes under either strategy and never depends on how many ranks wrote it.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from engine.dist import DistEnv
from engine.kinds import kind_of
from engine.user import UserCodeError
from mt.contract.config import Config
from mt.contract.toolchain import cxx_problem


@dataclass
class Parallel:
    """The module the loop calls, and the context that keeps gradients local on a non-final micro-step."""

    module: nn.Module
    no_sync: Callable[[], Any]
    strategy: str


def _recompute(block: nn.Module) -> None:
    """Activation checkpointing in place: the block keeps its name and parameters (checkpoints and
    the optimizer's groups see the same keys), only its forward recomputes in backward."""
    inner = block.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    block.forward = forward


def _compile(model: nn.Module, blocks: list[nn.Module], env: DistEnv) -> None:
    """torch.compile in place, each block (as torchtitan does: one graph the identical blocks share;
    FSDP's hooks stay outside it), or the whole model where it names no blocks. In place, so
    parameter and state-dict names carry no `_orig_mod.`: checkpoints, decay groups and init_from
    see the same keys as an eager run."""
    if env.device.type == "cpu":
        problem = cxx_problem()  # the same check mt launch made: a missing compiler fails here, not at step 1
        if problem:
            raise UserCodeError("train.compile", problem)
    for part in blocks or [model]:
        part.compile()  # mode "default"


def build(make: Callable[[], nn.Module], cfg: Config, env: DistEnv) -> nn.Module:
    """The model before `wrap`: whole on its device under ddp. Under fsdp rank 0 builds it whole in
    host memory (fully_shard moves each block to the device as it shards it) and the other ranks
    build a kind that allows it (`meta_build`: mt's GPT, an HF model) on the meta device, to receive
    their shards of rank 0's values in `wrap`: no rank but 0 ever holds the whole model. A factory's
    own code may need real tensors: every rank builds it."""
    if env.rank != 0 and _from_rank0(cfg, env):
        with torch.device("meta"):
            return make()
    return make().to(host(cfg, env))


def host(cfg: Config, env: DistEnv) -> torch.device:
    """Where the model is whole before `wrap` (and state loaded into it goes): under fsdp the CPU, else the run's device."""
    return torch.device("cpu") if cfg.train.strategy == "fsdp" else env.device


def _from_rank0(cfg: Config, env: DistEnv) -> bool:
    """Whether the ranks other than 0 built the model on the meta device (the same answer on every rank)."""
    return cfg.train.strategy == "fsdp" and env.world_size > 1 and kind_of(cfg).meta_build


def _receive_from_rank0(model: nn.Module, full: dict[str, Any] | None, env: DistEnv) -> None:
    """Ranks that built on meta get storage; then every rank its shards of rank 0's whole values, and
    the buffers a state dict leaves out (non-persistent ones, e.g. a causal mask) whole."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict
    if env.rank != 0:
        model.to_empty(device=env.device)
    set_model_state_dict(model, full if full is not None else {}, options=_options(broadcast_from_rank0=True))
    persistent = set(model.state_dict())
    for name, buf in model.named_buffers():
        if name not in persistent:
            torch.distributed.broadcast(buf, src=0)


def wrap(model: nn.Module, cfg: Config, env: DistEnv) -> Parallel:
    """Apply the preset's strategy to `model` (on its device; under fsdp on the CPU, which fully_shard
    moves to the device block by block); `model` stays the one to save."""
    t = cfg.train
    blocks = kind_of(cfg).blocks(model, cfg) if t.strategy == "fsdp" or t.activation_checkpointing or t.compile else []
    if t.activation_checkpointing:
        for block in blocks:
            _recompute(block)
    if t.compile:  # after recomputation (its checkpoint is traced too), before sharding
        _compile(model, blocks, env)
    if t.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(t.fsdp.param_dtype or t.precision)
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        # the mesh names this run's device: fully_shard's default follows any visible GPU instead
        mesh = init_device_mesh(env.device.type, (env.world_size,))
        # rank 0's whole values (before sharding replaces them) for the ranks that built on meta
        full = {k: v.detach() for k, v in model.state_dict().items()} if env.rank == 0 and _from_rank0(cfg, env) else None
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=t.fsdp.reshard_after_forward)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=t.fsdp.reshard_after_forward)
        if _from_rank0(cfg, env):
            _receive_from_rank0(model, full, env)
        return Parallel(model, functools.partial(_local_grads, model), "fsdp")
    if env.world_size == 1:  # one rank pays for no DDP: no wrapper, no bucketed all-reduce
        return Parallel(model, nullcontext, "ddp")
    ddp = DDP(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    return Parallel(ddp, ddp.no_sync, "ddp")


class Recompiles:
    """torch.compile's recompilations since the last look. Dynamo records every frame it compiles
    (torch._dynamo.utils compilation metrics, always on, unlike the "recompiles" log artifact, which
    needs torch's logging reconfigured); a recompile's record carries the guard failure that caused it."""

    def __init__(self) -> None:
        try:
            from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics
        except ImportError:  # an older torch without them: no count, training goes on
            self._get = self._clear = None
        else:
            self._get, self._clear = get_compilation_metrics, clear_compilation_metrics

    def take(self) -> list[tuple[str, str]]:
        """(function, torch's reason) of each recompile since the last call; first compiles are not listed."""
        found = self._get() if self._get is not None else None
        if not found:
            return []
        self._clear()  # the store keeps only the newest 64: emptied, nothing is counted twice or lost
        return [(m.co_name or "?", m.recompile_reason) for m in found if getattr(m, "recompile_reason", None)]


@contextmanager
def _local_grads(model: nn.Module) -> Iterator[None]:
    """FSDP's no_sync: gradients accumulate unsharded and unreduced until the final micro-step."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, **kw)


def full_state(par: Parallel, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, optimizer) state dicts of the whole model; collective under fsdp (every rank calls,
    rank 0 gets the tensors, on CPU)."""
    if par.strategy != "fsdp":
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    opts = _options(cpu_offload=True)
    return get_model_state_dict(model, options=opts), _numbered(get_optimizer_state_dict(model, optimizer, options=opts))


def _numbered(by_name: dict[str, Any]) -> dict[str, Any]:
    """A name-keyed optimizer state dict keyed by position, as Optimizer.state_dict() keys it."""
    if "param_groups" not in by_name:
        return by_name  # ranks other than 0 get nothing back: only rank 0 writes
    index = {n: i for i, n in enumerate(n for g in by_name["param_groups"] for n in g["params"])}
    return {"state": {index[n]: v for n, v in by_name["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in by_name["param_groups"]]}


def _named(numbered: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The inverse of _numbered for this optimizer: position i is its i-th parameter, by name."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    names = [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]
    return {"state": {names[i]: v for i, v in numbered["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in numbered["param_groups"]]}


def load_full_state(par: Parallel, model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict[str, Any],
                    optim_sd: dict[str, Any]) -> None:
    """Load whole-model state dicts (every rank holds them) into this rank's part of the model."""
    if par.strategy != "fsdp":
        model.load_state_dict(model_sd)
        optimizer.load_state_dict(optim_sd)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    set_model_state_dict(model, model_sd, options=_options())
    set_optimizer_state_dict(model, optimizer, _named(optim_sd, model, optimizer), options=_options())
