"""Per-step measurements: memory, heartbeats, peak FLOPs for MFU, provenance."""
from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import torch

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets; MFU is reported against these.
_PEAK_BF16 = (
    ("H200", 989e12), ("H100", 989e12), ("GH200", 989e12), ("A100", 312e12), ("A800", 312e12),
    ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12), ("RTX 4090", 165e12), ("RTX 3090", 71e12),
    ("V100", 125e12), ("B200", 2250e12),
)
_PAGE = os.sysconf("SC_PAGE_SIZE")


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, or None where unknown (CPUs: no meaningful MFU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in _PEAK_BF16:
        if key in name:
            return peak
    return None


def memory(device: torch.device) -> tuple[int, int]:
    """(allocated, peak) bytes: the CUDA caching allocator's view, or the process RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * _PAGE
    return rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD of the repository the run was launched from, if it is one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


