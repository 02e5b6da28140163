"""Sharded checkpoints through torch.distributed.checkpoint (DCP): every rank writes its own shards
of the model and optimizer (name-keyed state dicts), rank 0 adds train.pt and the manifest and
renames the folder into place; loading reshards onto any world size and never runs code.

DCP's own reader unpickles (torch 2.13): `FileSystemReader.read_metadata` is a plain
`pickle.load` of `.metadata`, and `DefaultLoadPlanner.load_bytes` a `torch.load(weights_only=False)`
of every non-tensor item. `SafeReader` and `SafePlanner` replace both: an Unpickler that builds
only DCP's metadata classes, and weights_only=True.
"""
from __future__ import annotations

import io
import pickle
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from engine.checkpoint import folder, full
from engine.checkpoint.folder import Saved
from mt.contract import door
from mt.contract.checkpoints import CheckpointError
from mt.contract.space import DiskFullError

# What a real .metadata pickles (read off one written by fully_shard + AdamW, see
# tests/engine/test_sharded.py): DCP's metadata dataclasses, torch.Size, dtypes, the layout helper.
_DCP_METADATA = ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                 "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
ALLOWED = frozenset(
    {("torch.distributed.checkpoint.metadata", n) for n in _DCP_METADATA}
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
       ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath")}
    | {("torch", n) for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)}
)


# DCP's CheckpointException (every rank's failure, gathered) derives from BaseException, not Exception
FAILED = (Exception, CheckpointException)


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata and nothing else: any other global is refused before it is imported."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata")
        return super().find_class(module, name)


def unpickle_metadata(data: bytes, where: str) -> Metadata:
    """A `.metadata` payload read without running code; CheckpointError (one line) otherwise."""
    try:
        md = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # noqa: BLE001 - a hostile or torn pickle fails in many ways: all are refusals
        raise CheckpointError(f"{where}: refused by the metadata unpickler: {type(e).__name__}: {e}") from None
    if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict):
        raise CheckpointError(f"{where}: not DCP metadata ({type(md).__name__})")
    for info in md.storage_data.values():  # shards are files of this folder, never a path elsewhere
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or "/" in rel or rel in ("", ".", ".."):
            raise CheckpointError(f"{where}: names shard file {rel!r}, not a file of its folder")
    return md


class SafeReader(FileSystemReader):
    """FileSystemReader whose metadata is read by the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        md = unpickle_metadata(door.read_bytes(path, METADATA_MAX_BYTES), str(path))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


METADATA_MAX_BYTES = 1 << 30
"""A DCP .metadata over this is refused unread (a 70B model's is tens of MiB)."""


class SafePlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner reading non-tensor items (param groups) with weights_only=True."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as e:  # noqa: BLE001 - weights_only refuses pickled code with UnpicklingError, and more
            raise CheckpointError(f"item {read_item.dest_index.fqn}: refused by weights_only load: {_why(e)}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def read_metadata(path: Path) -> Metadata:
    """The DCP metadata of checkpoint folder `path`, read without running code."""
    return unpickle_metadata(door.read_bytes(path / ".metadata", METADATA_MAX_BYTES), f"{path}/.metadata")


def read_byte_items(path: Path, md: Metadata) -> None:
    """Every non-tensor item (the param groups, a few bytes each) through SafePlanner in this one
    process: CheckpointError for one that weights_only refuses."""
    items = {k: None for k, v in md.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    if items:
        read_into(items, path, no_dist=True)


def model_shapes(md: Metadata) -> dict[str, torch.Tensor]:
    """The model's keys in a sharded checkpoint as empty meta tensors of the global shapes (for fit checks)."""
    return {k[len("model."):]: torch.empty(tuple(v.size), device="meta") for k, v in md.state_dict_metadata.items()
            if k.startswith("model.") and isinstance(v, TensorStorageMetadata)}


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shards of the model and optimizer, keyed by parameter name (any world size reads them)."""
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}


def read_into(state: dict[str, Any], path: Path, no_dist: bool = False) -> None:
    """dcp.load through SafeReader and SafePlanner; any failure is one CheckpointError line."""
    try:
        dcp.load(state, storage_reader=SafeReader(path), planner=SafePlanner(), no_dist=no_dist)
    except FAILED as e:
        raise CheckpointError(f"{path}: {_first_line(e)}") from None


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Collective: every rank reads its part of a sharded checkpoint into its shards of model and optimizer."""
    state = state_of(model, optimizer)  # initialises the optimizer's state so DCP has tensors to fill
    read_into(state, path)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])


def model_state(path: Path) -> dict[str, torch.Tensor]:
    """The whole model's state dict of a sharded checkpoint, on the CPU, in this one process."""
    md = read_metadata(path)
    state = {"model": {k[len("model."):]: torch.empty(tuple(v.size), dtype=v.properties.dtype)
                       for k, v in md.state_dict_metadata.items() if k.startswith("model.") and isinstance(v, TensorStorageMetadata)}}
    read_into(state, path, no_dist=True)
    return state["model"]


def _first_line(e: BaseException) -> str:
    """DCP's CheckpointException lists every rank's traceback: the first rank's cause is enough."""
    causes = getattr(e, "failures", None)
    if isinstance(causes, dict) and causes:
        rank, cause = min(causes.items(), key=lambda kv: kv[0])
        cause = cause[0] if isinstance(cause, tuple) else cause
        text = str(cause) if isinstance(cause, CheckpointError) else f"{type(cause).__name__}: {cause}"
        return f"rank {rank}: {text}".splitlines()[0][:500]
    return f"{type(e).__name__}: {e}".splitlines()[0][:500]


def _why(e: BaseException) -> str:
    """weights_only's reason in one line: the GLOBAL it refused (its message is a paragraph)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    named = [ln for ln in lines if "GLOBAL" in ln]
    return f"{type(e).__name__}: {(named or lines or [''])[0]}"


# ---- writing ----------------------------------------------------------------------------------
class _ReusedStager(BlockingAsyncStager):
    """Stages into one CPU copy kept between saves, so a save waits for a copy, not an allocation.

    torch's own cache pins that memory, which needs a CUDA device: pinned only where there is one.
    Reusing it is safe because a save first waits for the write before it (one in flight)."""

    def __init__(self) -> None:
        super().__init__(cache_staged_state_dict=True)

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        if self.state_dict_cache is None:
            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
        return _copy_state_dict(state_dict, self.state_dict_cache)  # non-tensor values: this save's own


@dataclass
class Pending:
    """One sharded write: this rank's DCP future, and what rank 0's commit made of it."""

    step: int
    info: dict[str, Any]                     # what the loop needs to report it (reason, requests)
    future: Future                           # this rank's DCP write
    blocking_s: float
    t0: float
    done: threading.Event = field(default_factory=threading.Event)
    saved: Saved | None = None               # rank 0, when committed
    error: BaseException | None = None       # rank 0, when the write or the commit failed


class ShardedWriter:
    """Writes sharded checkpoints, blocking or in the background (at most one in flight).

    Rank 0 picks the temporary folder and makes room; every rank writes its shards through DCP;
    when all have, rank 0 adds train.pt, hashes every file into the manifest and renames the
    folder into place (folder.py `commit`), then prunes."""

    def __init__(self, root: Path, keep_last: int, is_main: bool, background: bool) -> None:
        self.root, self.keep_last, self.is_main, self.background = root, keep_last, is_main, background
        self.pending: Pending | None = None
        self._group: Any = None
        self._stager = _ReusedStager() if background else None

    def _pg(self) -> Any:
        # a write in the background runs its collectives beside the loop's: a group of its own
        # (gloo: DCP's async save needs a CPU backend), made on first use by every rank together
        if self.background and self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def save(self, step: int, state: dict[str, Any], train_state: dict[str, Any] | None, meta: dict[str, Any],
             info: dict[str, Any], after_file: Callable[[str], None] | None = None, t0: float | None = None) -> Pending | None:
        """Collective. Returns the finished checkpoint (blocking) or None (in the background: see `wait`).

        Raises DiskFullError on rank 0 (the others return None) when even pruning first leaves no room.
        `t0`: when the loop began to save (the times reported count from it)."""
        t0 = time.perf_counter() if t0 is None else t0
        decision: list[Any] = [None, None]
        full: DiskFullError | None = None
        if self.is_main:
            try:
                room = folder.make_room(self.root, step, self.keep_last)
                decision = [str(folder.begin(self.root, step)), room.needed]
            except DiskFullError as e:
                full = e  # stays on rank 0, which reports it: the others need only "skip"
        dist.broadcast_object_list(decision, src=0)
        if decision[0] is None:
            if full is not None:
                raise full
            return None
        tmp, needed = Path(decision[0]), decision[1]
        writer = FileSystemWriter(tmp, sync_files=True)
        if self.background:
            future = dcp.async_save(state, storage_writer=writer, process_group=self._pg(), async_stager=self._stager)
        else:
            future = Future()
            try:
                future.set_result(dcp.save(state, storage_writer=writer))
            except FAILED as e:  # reported through the same path as a background failure
                future.set_exception(e)
        pending = Pending(step, info, future, time.perf_counter() - t0, t0)
        if self.is_main:
            commit = threading.Thread(target=self._commit, args=(pending, tmp, train_state, meta, after_file, needed),
                                      name=f"checkpoint-{step}", daemon=True)
            if self.background:
                commit.start()
            else:
                commit.run()
                pending.blocking_s = time.perf_counter() - t0  # blocking: the loop waited for all of it
        else:
            pending.done.set()
        if self.background:
            self.pending = pending
            return None
        return pending

    def _commit(self, p: Pending, tmp: Path, train_state: dict[str, Any] | None, meta: dict[str, Any],
                after_file: Callable[[str], None] | None, needed: int | None) -> None:
        """Rank 0, once every rank's shards are written: train.pt, the manifest, the rename, pruning."""
        try:
            try:
                p.future.result()
            except FAILED as e:  # the temporary folder goes; the error is reported
                raise folder.discard(tmp, self.root, p.step, e, needed) from e

            def write(into: Path) -> dict[str, Any]:
                files = full.write_parts(into, {"train.pt": train_state}, after_file)
                return {**files, **folder.hash_files(into, sorted(n.name for n in into.iterdir() if n.name != "train.pt"))}

            saved = folder.commit(self.root, p.step, tmp, write, {**meta, "layout": "sharded"}, needed, p.t0)
            saved.pruned = folder.prune(self.root, self.keep_last, saved.path)
            p.saved = saved
        except BaseException as e:  # noqa: BLE001 - handed to the loop, which reports it
            p.error = e if isinstance(e, Exception) else RuntimeError(_first_line(e))
        finally:
            p.done.set()

    def finished(self) -> Pending | None:
        """The background write that has completed since the last call (rank 0 reports it); never blocks."""
        p = self.pending
        if p is None or not p.done.is_set() or not p.future.done():
            return None
        self.pending = None
        return p

    def wait(self) -> Pending | None:
        """Block until the write in flight (if any) has completed on this rank; returns it."""
        p = self.pending
        if p is None:
            return None
        try:
            p.future.result()
        except FAILED:  # rank 0's commit reports it; the others only wait
            pass
        p.done.wait()
        self.pending = None
        return p
