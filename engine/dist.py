"""Process-group setup from torchrun's environment, device binding, per-rank logs and seeding."""
from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from mt.config import Config


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


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def redirect_output(log_path: Path) -> None:
    """Send this process's stdout and stderr (and its children's) to its rank log, appending."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def log(msg: str) -> None:
    """One timestamped line in this rank's log."""
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)
