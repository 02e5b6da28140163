"""The machine's GPUs as NVML sees them, in CUDA's order and as CUDA_VISIBLE_DEVICES shows them to a
run: the reader the sampler, the launch's device check and `mt doctor` share (never torch)."""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable


def read_or_none(fn: Callable[[], Any]) -> Any:
    """fn() or None when the value is not available (NVML raises per unsupported field)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - NVML and psutil raise many types; a reading that fails is N/A
        return None


@dataclass(frozen=True)
class Device:
    """A GPU (or a MIG slice of one) as NVML enumerates it."""

    index: int          # NVML's index (nvidia-smi's); a MIG slice's is its GPU's
    uuid: str | None    # NVML's UUID, with its GPU- or MIG- prefix
    bus: str            # PCI bus id: CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID
    name: str | None
    handle: Any = field(compare=False, hash=False)
    mig: int | None = None   # the slice's index within its GPU


def bare_uuid(uuid: str) -> str:
    """A UUID as every source can be compared: lower case, no GPU-/MIG- prefix (CUDA gives none)."""
    u = uuid.strip().lower()
    return u[4:] if u.startswith(("gpu-", "mig-")) else u


def parse_visible(value: str | None) -> list[int] | list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it (torch.cuda._parse_visible_devices' rules): None when unset;
    UUID prefixes (GPU-..., MIG-...) up to the first entry without the prefix; else ordinals up to the
    first negative or non-numeric one; a repeated entry hides every GPU ([])."""
    if value is None:
        return None
    items = value.split(",")
    if value.startswith(("GPU-", "MIG-")):
        uuids: list[str] = []
        for item in items:
            if not item.startswith(value[:4]):
                break
            if item in uuids:
                return []
            uuids.append(item)
        return uuids
    ordinals: list[int] = []
    for item in items:
        digits = re.match(r"\s*\+?(\d+)", item)   # strtoul: "1gpu" reads as 1
        if digits is None:
            break
        if int(digits.group(1)) in ordinals:
            return []
        ordinals.append(int(digits.group(1)))
    return ordinals


def cuda_order(gpus: list[Device], order: str | None) -> tuple[list[Device], bool]:
    """The whole GPUs in CUDA's enumeration order, and whether that order is certain: PCI bus order under
    CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default (FASTEST_FIRST) puts the fastest first, which is that same
    order on a node of one GPU model only (else the ranks' reported UUIDs decide)."""
    ordered = sorted((g for g in gpus if g.mig is None), key=lambda g: (g.bus, g.index))
    return ordered, order == "PCI_BUS_ID" or len({g.name for g in ordered}) <= 1


def visible_devices(devices: list[Device], env: Mapping[str, str]) -> tuple[list[Device], bool]:
    """The devices CUDA shows a process with `env`, in CUDA's order (cuda:0 first), and whether that
    order is certain (`cuda_order`; UUIDs name their devices whatever the order)."""
    ordered, certain = cuda_order(devices, env.get("CUDA_DEVICE_ORDER"))
    wanted = parse_visible(env.get("CUDA_VISIBLE_DEVICES"))
    if wanted is None:
        return ordered, certain
    out: list[Device] = []
    for item in wanted:
        if isinstance(item, int):
            found = ordered[item:item + 1]
        else:   # a UUID or a unique prefix of one; an ambiguous or unknown one ends the list, as in CUDA
            found = [d for d in devices if d.uuid and d.uuid.lower().startswith(item.lower())]
        if len(found) != 1:
            break
        out.append(found[0])
    return out, certain or bool(wanted) and isinstance(wanted[0], str)


class GpuReader:
    """NVML, initialised once; `error` says why there are no GPU readings. `nvml`: the module to use
    (pynvml by default; a test passes a stand-in for the hardware), `env`: the ranks' environment."""

    def __init__(self, nvml: Any = None, env: Mapping[str, str] | None = None) -> None:
        self.nvml = None
        self.error: str | None = None
        self.env = os.environ if env is None else env
        self._devices: list[Device] | None = None
        try:
            if nvml is None:
                import pynvml as nvml  # nvidia-ml-py; imported here so the CLI's start-up never pays for it

            nvml.nvmlInit()
            self.nvml = nvml
        except Exception as e:  # noqa: BLE001 - no NVML, whatever the reason, means CPU-only sampling
            self.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    @property
    def ok(self) -> bool:
        return self.nvml is not None

    def devices(self) -> list[Device]:
        """Every GPU NVML sees, and the MIG slices of those in MIG mode (read once: they do not change under a run)."""
        n = self.nvml
        if n is None:
            return []
        if self._devices is None:
            found = []
            for i in range(read_or_none(n.nvmlDeviceGetCount) or 0):
                h = read_or_none(lambda: n.nvmlDeviceGetHandleByIndex(i))
                found.append(_device(n, i, h, None))
                if h is not None and (read_or_none(lambda: n.nvmlDeviceGetMigMode(h)) or (0,))[0]:
                    for m in range(read_or_none(lambda: n.nvmlDeviceGetMaxMigDeviceCount(h)) or 0):
                        mh = read_or_none(lambda: n.nvmlDeviceGetMigDeviceHandleByIndex(h, m))
                        if mh is not None:
                            found.append(_device(n, i, mh, m))
            self._devices = found
        return self._devices

    def visible(self) -> int:
        """GPUs a worker may use: those of NVML's that CUDA_VISIBLE_DEVICES shows (0 without NVML)."""
        return len(visible_devices(self.devices(), self.env)[0]) if self.ok else 0

    def run_devices(self, uuids: dict[int, str], expect: int | None = None) -> list[tuple[Device, list[int]]]:
        """The run's GPUs and the ranks on each: those the ranks reported (rank -> CUDA's UUID); before any
        rank has, the first `expect` that CUDA shows the ranks (local rank i binds cuda:i), or all it shows
        while CUDA's order is uncertain (GPUs of several models under CUDA's default order)."""
        devices = self.devices()
        if uuids:
            by_uuid = {bare_uuid(d.uuid): d for d in devices if d.uuid}
            on: dict[Device, list[int]] = {}
            for rank, uuid in sorted(uuids.items()):
                d = by_uuid.get(bare_uuid(uuid))
                if d is not None:
                    on.setdefault(d, []).append(rank)
            return sorted(on.items(), key=lambda kv: (kv[0].index, kv[0].mig or 0))
        shown, certain = visible_devices(devices, self.env)
        return [(d, []) for d in (shown[:expect] if certain else shown)]

    def read(self, uuids: dict[int, str] | None = None, expect: int | None = None) -> list[dict[str, Any]]:
        """One entry per GPU of the run (`run_devices`), with the ranks on it."""
        n = self.nvml
        if n is None:
            return []
        gpus = []
        for d, ranks in self.run_devices(uuids or {}, expect):
            h = d.handle
            entry: dict[str, Any] = {"index": d.index, "mig": d.mig, "uuid": d.uuid, "name": d.name, "ranks": ranks,
                                     "util_pct": None, "mem_used_bytes": None, "mem_total_bytes": None,
                                     "temp_c": None, "power_w": None}
            if h is not None:
                mem = read_or_none(lambda: n.nvmlDeviceGetMemoryInfo(h))
                power_mw = read_or_none(lambda: n.nvmlDeviceGetPowerUsage(h))
                entry.update({   # a MIG slice has no utilisation, temperature or power of its own: None
                    "util_pct": read_or_none(lambda: float(n.nvmlDeviceGetUtilizationRates(h).gpu)),
                    "mem_used_bytes": int(mem.used) if mem is not None else None,
                    "mem_total_bytes": int(mem.total) if mem is not None else None,
                    "temp_c": read_or_none(lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
                    "power_w": power_mw / 1000.0 if power_mw is not None else None,
                })
            gpus.append(entry)
        return gpus

    def close(self) -> None:
        if self.nvml is not None:
            read_or_none(self.nvml.nvmlShutdown)
            self.nvml = None


def _text(v: Any) -> str | None:
    return v.decode(errors="replace") if isinstance(v, bytes) else v if isinstance(v, str) else None


def _device(n: Any, index: int, h: Any, mig: int | None) -> Device:
    """One enumerated device; what NVML cannot say is None ("" for the bus: sorted first)."""
    pci = read_or_none(lambda: n.nvmlDeviceGetPciInfo(h)) if h is not None else None
    bus = _text(getattr(pci, "busId", None)) or ""
    return Device(index, _text(read_or_none(lambda: n.nvmlDeviceGetUUID(h))) if h is not None else None, bus.lower(),
                  _text(read_or_none(lambda: n.nvmlDeviceGetName(h))) if h is not None else None, h, mig)
