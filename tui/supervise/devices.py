"""What a launch checks of this machine's devices before anything starts (NVML, never torch)."""
from __future__ import annotations

import os
import socket

from mt.contract.config import Config, ConfigError
from mt.contract.toolchain import cxx_problem


def check_devices(cfg: Config, source: str) -> None:
    """Refuse a device this machine does not have (asked of NVML: no torch here), or compile on CPU without
    a C++ compiler, before anything starts."""
    from tui.read.gpus import GpuReader

    launch = cfg.launch
    n = 0
    if launch.device != "cpu":
        gpus = GpuReader()
        try:
            n = gpus.visible()
        finally:
            gpus.close()
    if cfg.train.compile and n == 0:  # inductor's CPU code is C++: no compiler, no step 1
        problem = cxx_problem()
        if problem:
            raise ConfigError(source, "train.compile", problem)
    if launch.device == "cpu":
        return
    if launch.device == "cuda" and n == 0:
        why = gpus.error or ("CUDA_VISIBLE_DEVICES hides them" if "CUDA_VISIBLE_DEVICES" in os.environ else "NVML sees none")
        raise ConfigError(source, "launch.device", f"\"cuda\" but no NVIDIA GPU is visible on this machine ({why}); "
                                                   "use \"cpu\" or \"auto\"")
    if n and launch.nproc_per_node > n:  # every rank binds its own GPU (local rank = device index)
        raise ConfigError(source, "launch.nproc_per_node", f"{launch.nproc_per_node} ranks need {launch.nproc_per_node} GPUs, "
                                                           f"{n} visible here; at most {n}, or launch.device = \"cpu\"")


def device_warnings(cfg: Config) -> list[str]:
    """What is allowed but probably not meant: far more CPU ranks than cores."""
    from tui.read.gpus import GpuReader
    from tui.read.procs import usable_cores

    cores = usable_cores()
    on_cpu = cfg.launch.device == "cpu"
    if cfg.launch.device == "auto":
        gpus = GpuReader()
        on_cpu = gpus.visible() == 0
        gpus.close()
    nproc = cfg.launch.nproc_per_node
    if on_cpu and nproc > cores:
        return [f"launch.nproc_per_node = {nproc} CPU ranks on {cores} usable cores: the ranks share the cores "
                "and every step waits for the slowest; fewer ranks will be faster"]
    return []


def node_device_problem(cfg: Config, under_slurm: bool) -> str | None:
    """Under Slurm, why this node's devices cannot run launch.device (checked by its supervisor, where its ranks
    run, never on the login node), naming the node; None: they can."""
    try:
        if under_slurm and not cfg.launch.script:
            check_devices(cfg, f"node {os.environ.get('SLURMD_NODENAME') or socket.gethostname()}")
    except ConfigError as e:
        return str(e)
    return None
