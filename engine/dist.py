"""Process-group setup from torchrun's environment, device binding, per-rank logs (a failure's one line too) and seeding."""
from __future__ import annotations

import os
import random
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

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

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_env() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun; a plain `python -m engine` is a world of one."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def pick_device(cfg: Config, local_rank: int) -> torch.device:
    want = cfg.launch.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("launch.device = \"cuda\" but torch sees no CUDA device")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init(cfg: Config) -> DistEnv:
    """Bind the device and start the process group (NCCL on CUDA, gloo on CPU)."""
    rank, local_rank, world = read_env()
    device = pick_device(cfg, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=cfg.launch.pg_timeout_s)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:  # run without torchrun (tests, debugging): a group of one needs no rendezvous
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return DistEnv(rank, local_rank, world, device, backend)


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
