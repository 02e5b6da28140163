"""One `system.jsonl` sample: GPUs via NVML, rank processes and host via psutil.

A value that cannot be read is None (null), never an exception; without NVML the sample
says so (`nvml: false`, `nvml_error`) and still carries the rest.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import psutil

from mt.contract import door
from mt.contract.events import dumps
from mt.contract.heartbeat import read_heartbeats
from mt.contract.paths import RunPaths
from mt.contract.system import clean_sample
from tui.diagnose.probes import sample_detail
from tui.read.gpus import GpuReader, read_or_none
from tui.read.procs import alive


def gpu_reports(paths: RunPaths, rank_pids: dict[int, int]) -> dict[int, dict[str, Any]]:
    """Each live rank's `gpu` heartbeat field (its GPU's UUID and allocator bytes), by rank; only a heartbeat
    written by the pid the rank has now counts (an earlier attempt's file says nothing of this one)."""
    hbs = read_heartbeats(paths, ranks=range(max(rank_pids, default=-1) + 1))
    return {r: hb["gpu"] for r, hb in hbs.items() if "gpu" in hb and hb.get("pid") == rank_pids.get(r)}


class SystemSampler:
    """Builds one sample a call; keeps psutil.Process objects so CPU % covers the interval.

    `heartbeats`: the node's run directory, whose heartbeats say each rank's GPU (only those are sampled)
    and its allocator's memory; `expect`: this node's ranks, the GPUs sampled before any rank has said."""

    def __init__(self, gpus: GpuReader | None = None, heartbeats: RunPaths | None = None,
                 expect: int | None = None) -> None:
        self.gpus = gpus if gpus is not None else GpuReader()
        self.heartbeats, self.expect = heartbeats, expect
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

    def _rank(self, rank: int, pid: int | None, detail: bool = False, gpu: dict[str, Any] | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {"rank": rank, "pid": pid, "cpu_pct": None, "rss_bytes": None, "alive": False}
        if gpu:   # its heartbeat's: the GPU it uses (CUDA's UUID) and its allocator at its last step
            entry.update(gpu=gpu.get("uuid"), mem_alloc_bytes=gpu["alloc"], mem_reserved_bytes=gpu["reserved"],
                         mem_peak_bytes=gpu["peak"], mem_total_bytes=gpu["total"])
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
        reports = gpu_reports(self.heartbeats, rank_pids) if self.heartbeats is not None and rank_pids else {}
        uuids = {r: g["uuid"] for r, g in reports.items() if g.get("uuid")}
        vm = read_or_none(psutil.virtual_memory)
        load = read_or_none(os.getloadavg)
        return {
            "v": 1,
            "t": time.time() if now is None else now,
            "nvml": self.gpus.ok,
            "nvml_error": self.gpus.error,
            "gpus": self.gpus.read(uuids, self.expect),
            "ranks": [self._rank(r, pid, detail, reports.get(r)) for r, pid in sorted(rank_pids.items())],
            "host": {
                "cpu_pct": read_or_none(lambda: psutil.cpu_percent(None)),
                "mem_used_bytes": int(vm.total - vm.available) if vm is not None else None,
                "mem_total_bytes": int(vm.total) if vm is not None else None,
                "load1": load[0] if load is not None else None,
            },
        }

    def close(self) -> None:
        self.gpus.close()
