"""One `system.jsonl` sample: GPUs via NVML, rank processes and host via psutil.

A value that cannot be read is None (null), never an exception; without NVML the sample
says so (`nvml: false`, `nvml_error`) and still carries the rest.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from mt.contract import door
from mt.contract.events import dumps
from mt.contract.system import clean_sample
from tui.diagnose.probes import sample_detail
from tui.read.procs import alive


def _read(fn: Callable[[], Any]) -> Any:
    """fn() or None when the value is not available (NVML raises per unsupported field)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - NVML and psutil raise many types; a reading that fails is N/A
        return None


class GpuReader:
    """NVML, initialised once; `error` says why there are no GPU readings."""

    def __init__(self) -> None:
        self.nvml = None
        self.error: str | None = None
        try:
            import pynvml  # nvidia-ml-py; imported here so the CLI's start-up never pays for it

            pynvml.nvmlInit()
            self.nvml = pynvml
        except Exception as e:  # noqa: BLE001 - no NVML, whatever the reason, means CPU-only sampling
            self.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    @property
    def ok(self) -> bool:
        return self.nvml is not None

    def visible(self) -> int:
        """GPUs a worker may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES (0 without NVML)."""
        listed = os.environ.get("CUDA_VISIBLE_DEVICES")
        if listed is not None:
            ids = [d for d in listed.split(",") if d.strip()]
            # CUDA stops at the first invalid entry (e.g. "-1" hides every GPU)
            ids = ids[:next((i for i, d in enumerate(ids) if d.strip().startswith("-")), len(ids))]
            if not ids:
                return 0
        found = (_read(self.nvml.nvmlDeviceGetCount) or 0) if self.nvml is not None else 0
        return found if listed is None else min(found, len(ids))

    def read(self) -> list[dict[str, Any]]:
        """One entry per GPU the driver shows."""
        n = self.nvml
        if n is None:
            return []
        count = _read(n.nvmlDeviceGetCount) or 0
        gpus = []
        for i in range(count):
            h = _read(lambda: n.nvmlDeviceGetHandleByIndex(i))
            if h is None:
                gpus.append({"index": i, "name": None, "util_pct": None, "mem_used_bytes": None,
                             "mem_total_bytes": None, "temp_c": None, "power_w": None})
                continue
            name = _read(lambda: n.nvmlDeviceGetName(h))
            mem = _read(lambda: n.nvmlDeviceGetMemoryInfo(h))
            power_mw = _read(lambda: n.nvmlDeviceGetPowerUsage(h))
            gpus.append({
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else name,
                "util_pct": _read(lambda: float(n.nvmlDeviceGetUtilizationRates(h).gpu)),
                "mem_used_bytes": int(mem.used) if mem is not None else None,
                "mem_total_bytes": int(mem.total) if mem is not None else None,
                "temp_c": _read(lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
                "power_w": power_mw / 1000.0 if power_mw is not None else None,
            })
        return gpus

    def close(self) -> None:
        if self.nvml is not None:
            _read(self.nvml.nvmlShutdown)
            self.nvml = None


class SystemSampler:
    """Builds one sample a call; keeps psutil.Process objects so CPU % covers the interval."""

    def __init__(self, gpus: GpuReader | None = None) -> None:
        self.gpus = gpus if gpus is not None else GpuReader()
        self._procs: dict[int, psutil.Process] = {}
        self._write_error = ""   # the last failed write's error: logged once, not every second
        psutil.cpu_percent(None)  # primes the host counter: the first real reading is a delta

    def _proc(self, pid: int) -> psutil.Process | None:
        p = self._procs.get(pid)
        if p is None:
            try:
                p = psutil.Process(pid)
                p.cpu_percent(None)  # primes; this first call always returns 0.0
            except psutil.NoSuchProcess:
                return None
            self._procs[pid] = p
        return p

    def _rank(self, rank: int, pid: int | None, detail: bool = False) -> dict[str, Any]:
        entry: dict[str, Any] = {"rank": rank, "pid": pid, "cpu_pct": None, "rss_bytes": None, "alive": False}
        p = self._proc(pid) if pid else None
        if p is None:
            return entry
        try:
            with p.oneshot():
                cpu, rss = p.cpu_percent(None), p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return entry
        # an exiting process has already given back its memory (rss 0) before it is a zombie
        if alive(p) and rss > 0:
            entry.update(alive=True, cpu_pct=cpu, rss_bytes=rss)
            if detail:
                entry.update(sample_detail(p.pid))
        return entry

    def append(self, rank_pids: dict[int, int], path: Path, log: logging.Logger,
               detail: bool = False) -> dict[str, Any] | None:
        """Take a sample and append it to system.jsonl at `path`; returns it cleaned (None if sampling
        failed); a failed write is logged, never raised: the rules still get the sample."""
        try:
            sample = self.sample(rank_pids, detail=detail)
        except Exception:
            log.exception("cannot sample the system")
            return None
        try:
            fd = door.open_append(path)     # never through a link or into a FIFO
            try:
                os.write(fd, (dumps(sample) + "\n").encode())
            finally:
                os.close(fd)
            self._write_error = ""
        except OSError as e:
            if str(e) != self._write_error:
                log.error("cannot write %s: %s (said once until it changes)", path.name, e)
            self._write_error = str(e)
        return clean_sample(sample)

    def sample(self, rank_pids: dict[int, int], now: float | None = None, detail: bool = False) -> dict[str, Any]:
        """The system.jsonl record for this moment; rank_pids maps global rank -> pid. `detail`: each
        live rank's system call and DataLoader workers too (a job's node whose ranks the rules cannot
        read in /proc: the job's supervisor runs on another machine)."""
        for pid in [pid for pid in self._procs if pid not in rank_pids.values()]:
            del self._procs[pid]  # an old attempt's worker: forget it
        vm = _read(psutil.virtual_memory)
        load = _read(os.getloadavg)
        return {
            "v": 1,
            "t": time.time() if now is None else now,
            "nvml": self.gpus.ok,
            "nvml_error": self.gpus.error,
            "gpus": self.gpus.read(),
            "ranks": [self._rank(r, pid, detail) for r, pid in sorted(rank_pids.items())],
            "host": {
                "cpu_pct": _read(lambda: psutil.cpu_percent(None)),
                "mem_used_bytes": int(vm.total - vm.available) if vm is not None else None,
                "mem_total_bytes": int(vm.total) if vm is not None else None,
                "load1": load[0] if load is not None else None,
            },
        }

    def close(self) -> None:
        self.gpus.close()
