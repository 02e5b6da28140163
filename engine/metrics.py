"""Per-step measurements: memory, heartbeats, peak FLOPs for MFU, provenance."""
from __future__ import annotations

import os
import resource
import subprocess
from dataclasses import dataclass
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


@dataclass(frozen=True)
class StepMemory:
    """One rank's memory at the end of a step: the CUDA caching allocator's view, or the process RSS on CPU."""
    allocated: int  # bytes in live tensors
    reserved: int  # bytes the allocator holds from the driver (allocated + its cache); RSS on CPU
    peak: int  # most bytes allocated since the previous step's reading (CPU: the process's high-water RSS)


def memory(device: torch.device) -> StepMemory:
    """This step's memory; on CUDA the peak is reset, so the next reading is the next step's own peak
    (host-side counters: no device sync)."""
    if device.type == "cuda":
        # one read of the allocator's counters (memory_allocated and the others each build this whole dict)
        stats = torch.cuda.memory_stats(device)
        got = StepMemory(int(stats.get("allocated_bytes.all.current", 0)), int(stats.get("reserved_bytes.all.current", 0)),
                         int(stats.get("allocated_bytes.all.peak", 0)))
        torch.cuda.reset_peak_memory_stats(device)
        return got
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * _PAGE
    return StepMemory(rss, rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def gpu_identity(device: torch.device) -> tuple[str | None, int]:
    """(the GPU's UUID as CUDA gives it, its memory in bytes) for the heartbeat: NVML samples the GPU with
    that UUID (CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER are already applied to `device`'s index)."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)   # torch >= 2.0; older ones: no UUID, the sampler goes by order
    return (str(uuid) if uuid is not None else None), int(props.total_memory)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD of the repository the run was launched from, if it is one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


