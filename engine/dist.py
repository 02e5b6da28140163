"""Process-group setup from torchrun's environment, device binding, per-rank logs (a failure's one line too) and seeding."""
from __future__ import annotations

import inspect
import json
import os
import random
import socket
import time
import traceback
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from mt.contract.config import Config
from mt.contract.space import DiskFullError


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    # gloo beside the default group, for host-only collectives that may wait on rank 0's disk (a checkpoint
    # written or hashed): its timeout is HOST_WAIT_S, never pg_timeout_s. None in a world of one.
    host_group: Any = field(default=None, compare=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_env() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun; a plain `python -m engine` is a world of one."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class DeviceError(RuntimeError):
    """The ranks cannot use launch.device (a rank without its GPU, or "auto" finding CUDA on some nodes only)."""


HOST_WAIT_S = 24 * 3600.0
"""The host group's timeout: rank 0 writing or hashing a checkpoint of any size on any storage fits in it."""


def probe_device(want: str, local_rank: int) -> tuple[str, str]:
    """What this rank can use for launch.device `want`: ("cuda" | "cpu", "") or ("", why it cannot)."""
    if want == "cpu":
        return "cpu", ""
    with warnings.catch_warnings(record=True) as caught:  # a broken driver is only a warning of is_available
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if available:
        n = torch.cuda.device_count()
        return ("cuda", "") if local_rank < n else ("", f"local rank {local_rank} needs GPU {local_rank}, torch sees {n}")
    if want == "auto":
        return "cpu", ""
    cause = next((str(w.message).splitlines()[0] for w in caught if "CUDA" in str(w.message)), "")
    return "", "launch.device = \"cuda\" but torch sees no CUDA device" + (f" ({cause})" if cause else "")


def device_verdict(want: str, reports: list[dict[str, str]]) -> str:
    """The one device type every rank uses, from each rank's probe ({host, device, why}); RuntimeError naming
    the ranks and nodes that cannot (DeviceError), so a broken node fails every rank at start, not at a timeout."""
    def where(ranks: list[int]) -> str:
        hosts = sorted({reports[r]["host"] for r in ranks})
        return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks[:8]))}{' ...' if len(ranks) > 8 else ''} " \
               f"on node{'s' if len(hosts) > 1 else ''} {', '.join(hosts[:4])}"
    broken = [r for r, rep in enumerate(reports) if rep["why"]]
    if broken:
        raise DeviceError(f"{where(broken)}: {reports[broken[0]]['why']}")
    kinds = {rep["device"] for rep in reports}
    if len(kinds) > 1:  # "auto" found CUDA on some nodes only: NCCL there and gloo here could never meet
        cpu = [r for r, rep in enumerate(reports) if rep["device"] == "cpu"]
        raise DeviceError(f"launch.device = \"{want}\": {where(cpu)} see no CUDA device while the others do; "
                           "fix those nodes' driver, or set launch.device to \"cpu\" or \"cuda\"")
    return kinds.pop()


def _agreed_device(store: Any, rank: int, world: int, want: str, local_rank: int) -> str:
    """Every rank's probe through the rendezvous store (before any process group exists), then the verdict."""
    mine, why = probe_device(want, local_rank)
    prefix = f"mt/device/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store.set(prefix + str(rank), json.dumps({"host": socket.gethostname(), "device": mine, "why": why}))
    return device_verdict(want, [json.loads(store.get(prefix + str(r))) for r in range(world)])


def init(cfg: Config) -> DistEnv:
    """Agree on the device type, bind it, start the process group (NCCL on CUDA, gloo on CPU) and the host group."""
    rank, local_rank, world = read_env()
    timeout = timedelta(seconds=cfg.launch.pg_timeout_s)
    if "MASTER_ADDR" in os.environ:
        store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
        store.set_timeout(timeout)
    else:  # run without torchrun (tests, debugging): a group of one needs no rendezvous
        store, rank, world = dist.HashStore(), 0, 1
    kind = _agreed_device(store, rank, world, cfg.launch.device, local_rank)
    device = torch.device("cuda", local_rank) if kind == "cuda" else torch.device("cpu")
    backend = "nccl" if kind == "cuda" else "gloo"
    extra: dict[str, Any] = {}
    if kind == "cuda":
        torch.cuda.set_device(device)
        if "device_id" in inspect.signature(dist.init_process_group).parameters:  # torch >= 2.3
            extra["device_id"] = device  # NCCL connects now: a bad GPU or fabric fails here, not in the first step
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout, **extra)
    host = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(HOST_WAIT_S, cfg.launch.pg_timeout_s))) \
        if world > 1 else None
    return DistEnv(rank, local_rank, world, device, backend, host)


def shutdown(clean: bool) -> None:
    """Destroy the process group after a clean end. After a failure another rank may still be inside
    a collective and destroying would wait on it (torchtitan#1342): the process's exit frees it."""
    if clean and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def log(msg: str) -> None:
    """One timestamped line in this rank's log."""
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def report_failure(exc: BaseException) -> str:
    """Print the traceback to the rank log; return the one line a run_end carries."""
    traceback.print_exception(exc)
    text = str(exc) if isinstance(exc, DiskFullError) else f"{type(exc).__name__}: {exc}"  # it says what it is
    return text.splitlines()[0][:500]
