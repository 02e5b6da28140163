"""A stand-in for pynvml over GPUs described in a list: the hardware this machine lacks, behind the
same calls `tui/read/gpus.py` makes (nvidia-ml-py's names and return shapes). The mapping of CUDA's
view to NVML's, and everything built on it, is the real code under test."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    """pynvml.NVMLError's place: a field this device does not support."""


@dataclass
class FakeGpu:
    uuid: str                     # NVML's form: GPU-... (a slice's: MIG-...)
    bus: str                      # PCI bus id, e.g. 00000000:1B:00.0
    name: str = "NVIDIA H100 80GB HBM3"
    used: int = 10 * 2**30
    total: int = 80 * 2**30
    util: int = 50
    migs: list[FakeGpu] = field(default_factory=list)   # its MIG slices (MIG mode on when any)


class FakeNvml:
    """The NVML calls the sampler makes, answered from `gpus` (listed in NVML's index order)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        if h.uuid.startswith("MIG-"):
            raise NVMLError("Not Supported")
        return SimpleNamespace(busId=h.bus.encode())   # older nvidia-ml-py gives bytes

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(used=h.used, total=h.total, free=h.total - h.used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        if h.uuid.startswith("MIG-"):
            raise NVMLError("Not Supported")   # a MIG slice has no utilisation of its own
        return SimpleNamespace(gpu=h.util, memory=0)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return 60

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return 300_000

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> tuple[int, int]:
        return (1, 1) if h.migs else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return 7 if h.migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, m: int) -> FakeGpu:
        if m >= len(h.migs):
            raise NVMLError("Not Found")   # NVML: slots of the 7 that hold no slice
        return h.migs[m]


def uuid_of(i: int) -> str:
    """A GPU's UUID, NVML's form."""
    return f"GPU-{i:08x}-1111-2222-3333-{i:012x}"


def eight_gpus(**kw: Any) -> list[FakeGpu]:
    """Eight GPUs whose NVML order is not their PCI bus order (index i sits on bus 7 - i)."""
    return [FakeGpu(uuid_of(i), f"00000000:{0x10 + 7 - i:02X}:00.0", **kw) for i in range(8)]
