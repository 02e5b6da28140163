"""Per-step measurements: memory, heartbeats, GPU peaks and torch's FLOP count for MFU, provenance."""
from __future__ import annotations

import os
import re
import resource
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from engine.dist import log


@dataclass(frozen=True)
class Peak:
    """One GPU's dense peaks in TFLOP/s (no 2:4 sparsity) by the math a run's matmuls use, and its SMs."""

    fp32: float              # CUDA cores, no tensor cores
    tf32: float | None       # fp32 matmuls on tensor cores (None: the GPU has none for it)
    bf16: float | None
    fp16: float
    sms: int                 # the whole GPU's streaming multiprocessors: a MIG slice has a share of them


# Keyed by the words of torch.cuda.get_device_name (upper-cased, split at anything not a letter or
# digit): the entry whose words all appear and that has the most of them wins, so "NVIDIA H100 PCIe"
# is the PCIe card, not the SXM one, and "NVIDIA L40" never matches L4. Where a datasheet gives only
# the sparse figure (marked *), the dense peak is half of it.
PEAKS: dict[tuple[str, ...], Peak] = {
    # NVIDIA H100 Tensor Core GPU datasheet: SXM 67 / 989* / 1979* / 1979*, PCIe 51 / 756* / 1513*,
    # NVL 60 / 835* / 1671* (FP32 / TF32 / BF16 / FP16)
    ("H100",): Peak(67, 494.5, 989.5, 989.5, 132),
    ("H100", "PCIE"): Peak(51, 378, 756.5, 756.5, 114),
    ("H100", "NVL"): Peak(60, 417.5, 835.5, 835.5, 132),
    # NVIDIA H200 Tensor Core GPU datasheet: SXM 67 / 989* / 1979*, NVL 60 / 835* / 1671*
    ("H200",): Peak(67, 494.5, 989.5, 989.5, 132),
    ("H200", "NVL"): Peak(60, 417.5, 835.5, 835.5, 132),
    # NVIDIA H800 Tensor Core GPU datasheet: SXM 67 / 989* / 1979*, PCIe 51 / 756* / 1513*
    ("H800",): Peak(67, 494.5, 989.5, 989.5, 132),
    ("H800", "PCIE"): Peak(51, 378, 756.5, 756.5, 114),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: the H100 SXM's GPU, 67 / 989* / 1979*
    ("GH200",): Peak(67, 494.5, 989.5, 989.5, 132),
    # NVIDIA HGX B200 datasheet, per GPU (the 8-GPU board's figures / 8): 75 / 2.25 P* / 4.5 P*
    ("B200",): Peak(75, 1125, 2250, 2250, 148),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 and PCIe alike): 19.5 / 156 / 312 / 312
    ("A100",): Peak(19.5, 156, 312, 312, 108),
    # NVIDIA A800 Tensor Core GPU datasheet: 19.5 / 156 / 312 / 312
    ("A800",): Peak(19.5, 156, 312, 312, 108),
    # NVIDIA A30 datasheet: 10.3 / 82 / 165 / 165
    ("A30",): Peak(10.3, 82, 165, 165, 56),
    # NVIDIA A40 datasheet: 37.4 / 74.8 / 149.7 / 149.7
    ("A40",): Peak(37.4, 74.8, 149.7, 149.7, 84),
    # NVIDIA A10 datasheet: 31.2 / 62.5 / 125 / 125
    ("A10",): Peak(31.2, 62.5, 125, 125, 72),
    # NVIDIA L40S datasheet: 91.6 / 183 / 362.05 / 362.05
    ("L40S",): Peak(91.6, 183, 362.05, 362.05, 142),
    # NVIDIA L40 datasheet: 90.5 / 90.5 / 181.05 / 181.05
    ("L40",): Peak(90.5, 90.5, 181.05, 181.05, 142),
    # NVIDIA L4 datasheet: 30.3 / 120* / 242* / 242*
    ("L4",): Peak(30.3, 60, 121, 121, 58),
    # NVIDIA Ada GPU architecture whitepaper, RTX 4090 (FP32 accumulate): 82.6 / 82.6 / 165.2 / 165.2
    ("RTX", "4090"): Peak(82.6, 82.6, 165.2, 165.2, 128),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090 (FP32 accumulate): 35.6 / 35.6 / 71 / 71
    ("RTX", "3090"): Peak(35.6, 35.6, 71, 71, 82),
    # NVIDIA Tesla V100 datasheet: SXM2 15.7 FP32 / 125 FP16 tensor, PCIe 14 / 112; no TF32, no BF16
    ("V100",): Peak(15.7, None, None, 125, 80),
    ("V100", "PCIE"): Peak(14, None, None, 112, 80),
}
_PAGE = os.sysconf("SC_PAGE_SIZE")


def peak_of(name: str) -> Peak | None:
    """The table's entry for a CUDA device name: the one with the most words that all appear in it."""
    words = set(re.split(r"[^0-9A-Z]+", name.upper()))
    found = [key for key in PEAKS if words.issuperset(key)]
    return PEAKS[max(found, key=len)] if found else None


def peak_for(name: str, math: str, sms: int) -> float | None:
    """Dense peak FLOP/s of `name` for `math` (fp32, tf32, bf16, fp16) on `sms` of its SMs (a MIG
    slice: its share of the GPU); None where the table has no such GPU or math."""
    peak = peak_of(name)
    tflops = getattr(peak, math, None) if peak else None
    if peak is None or tflops is None:
        return None
    return tflops * 1e12 * min(1.0, sms / peak.sms)


def run_math(precision: str) -> str:
    """What a run's matmuls run in: bf16, fp16, or fp32 on tensor cores (tf32) where torch allows it."""
    if precision in ("bf16", "fp16"):
        return precision
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def peak_flops(device: torch.device, precision: str) -> float | None:
    """This process's GPU's dense peak for the run's math, or None where unknown (CPUs: no meaningful MFU)."""
    if device.type != "cuda":
        return None
    name, math = torch.cuda.get_device_name(device), run_math(precision)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    peak = peak_for(name, math, sms)
    if peak is None:
        log(f"MFU not shown: no dense {math} peak for {name} in engine/metrics.py")
    else:  # the peak MFU is judged against, in the rank log (bench/gpu_check.py prints it)
        log(f"MFU against {peak / 1e12:.1f} TFLOP/s: dense {math} of {name} on {sms} of its {getattr(peak_of(name), 'sms', '?')} SMs")
    return peak


def _cpu_attention() -> dict[Any, Any]:
    """Formulas for the CPU's flash attention, which torch's counter lacks (a CPU run's count would
    leave attention out): the same count as its CUDA kernels get (torch.utils.flop_counter)."""
    from torch.utils import flop_counter as fc
    aten = torch.ops.aten
    if not hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu") or not hasattr(fc, "sdpa_backward_flop_count"):
        return {}  # an older torch: attention on the CPU goes uncounted

    def forward(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return fc.sdpa_flop_count(q, k, v)

    def backward(grad: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return fc.sdpa_backward_flop_count(grad, q, k, v)

    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


class FlopCount:
    """One optimizer step's model FLOPs on this rank, counted by torch's FlopCounterMode around its
    forwards and backwards (each a fresh counter: entering one clears it)."""

    def __init__(self, recompute: bool) -> None:
        self.formulas = _cpu_attention()
        # activation checkpointing runs the forward again inside the backward: a count of the
        # backward would hold it, so the model's FLOPs are 3 x the forward's, as 6N assumes
        self.recompute = recompute
        self.forward_flops = self.backward_flops = 0

    @contextmanager
    def forward(self) -> Iterator[None]:
        with FlopCounterMode(display=False, custom_mapping=self.formulas) as counter:
            yield
        self.forward_flops += counter.get_total_flops()

    @contextmanager
    def backward(self) -> Iterator[None]:
        if self.recompute:
            yield
            return
        with FlopCounterMode(display=False, custom_mapping=self.formulas) as counter:
            yield
        self.backward_flops += counter.get_total_flops()

    def total(self) -> int:
        """The step's model FLOPs (0: the counter saw no matmul)."""
        return 3 * self.forward_flops if self.recompute else self.forward_flops + self.backward_flops


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


