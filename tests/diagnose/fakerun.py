"""A run directory written by hand, on a simulated clock, with an IncidentMonitor polling it.

Events and status.json go through tests/tui/synth.py's writers; the events hold only the fields
the rules read.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mt.contract.config import Config, MonitorConfig, RunConfig
from mt.contract.events import dumps
from mt.contract.jsonl import read_events
from mt.contract.paths import RunPaths
from tests.tui.synth import event_line, write_status
from tui.diagnose.monitor import IncidentMonitor

T0 = 1_800_000_000.0


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _on_gpu(rank: int, peak_share: float) -> dict[str, Any]:
    """A rank entry's GPU fields, as the supervisor copies them from the rank's heartbeat."""
    total = 80 * 2**30
    return {"gpu": f"{rank:08x}-0000-0000-0000-000000000000", "mem_alloc_bytes": int(total * peak_share * 0.8),
            "mem_reserved_bytes": int(total * max(peak_share, 0.9)), "mem_peak_bytes": int(total * peak_share),
            "mem_total_bytes": total}


class FakeRun:
    """Writes events/system/heartbeats/status like the engine and supervisor would."""

    def __init__(self, root: Path, monitor: MonitorConfig | None = None, world: int = 2,
                 eval_every: int = 0, checkpoint_every: int = 0, num_workers: int = 1, script: str = "") -> None:
        self.paths = RunPaths(root)
        root.mkdir(parents=True, exist_ok=True)
        (root / "logs").mkdir(exist_ok=True)
        cfg = Config(run=RunConfig(name="fake"))
        cfg.launch.nproc_per_node = world
        cfg.train.eval_every, cfg.checkpoint.every_steps = eval_every, checkpoint_every
        cfg.data.num_workers = num_workers
        cfg.launch.script = script   # a user's script: its checkpoints come when it decides
        cfg.monitor = monitor or MonitorConfig()
        self.paths.config.write_text(json.dumps(cfg.to_dict()))
        self.world, self.m = world, cfg.monitor
        self.now = T0
        self.step = 0
        self.attempt = 0
        self.pids = {r: os.getpid() for r in range(world)}
        self.status({"state": "running", "attempt": 1, "exit_code": None})
        self.monitor = IncidentMonitor(root, cfg.monitor)
        self.records: list[dict[str, Any]] = []

    # -- writers ---------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> None:
        with open(self.paths.events, "a") as f:
            f.write(event_line(kind, self.now, partial=True, **fields) + "\n")

    def status(self, st: dict[str, Any]) -> None:
        write_status(self.paths, st)

    def heartbeat(self, rank: int, step: int, t: float | None = None) -> None:
        self.paths.heartbeat_dir.mkdir(exist_ok=True)
        # a plain write (rename is slow on this filesystem); the reader copes with a torn file
        self.paths.heartbeat(rank).write_text(json.dumps({"step": step, "t": self.now if t is None else t,
                                                          "pid": self.pids[rank], "rank": rank, "attempt": self.attempt}))

    def start(self, start_step: int = 0, params_total: int = 800_000, max_steps: int = 10**6, **fields: Any) -> None:
        """A new attempt's run_start; `fields`: more of its fields (backend="nccl": a CUDA run)."""
        self.attempt += 1
        self.step = start_step
        self.status({"state": "running", "attempt": self.attempt, "exit_code": None})
        self.event("run_start", attempt=self.attempt, world_size=self.world, start_step=start_step,
                   max_steps=max_steps, params_total=params_total, **fields)

    def do_step(self, step_time: float = 0.2, data_wait: float = 0.01, tokens: float = 4096,
                loss: float = 3.0, beats: tuple[int, ...] | None = None, poll: bool = True,
                sleep: float = 0.0, **extra: Any) -> None:
        """One optimizer step taking step_time seconds, plus `sleep` seconds the engine does not
        time (like [faults] step_sleep_s); the monitor polls each second meanwhile."""
        wall = step_time + sleep
        whole = int(wall)
        if poll:
            self.idle(float(whole))
        self.now += wall - whole
        self.step += 1
        self.event("step", step=self.step, loss=loss, lr=1e-3, grad_norm=0.5, clipped=False,
                   tokens_per_s=tokens / step_time, step_time_s=step_time, data_wait_s=data_wait,
                   skipped=False, **extra)
        for r in range(self.world) if beats is None else beats:
            self.heartbeat(r, self.step)
        if poll:
            self.poll()

    def sample(self, gpu_util: float | None = None, mem_share: float | None = None,
               host_mem_share: float = 0.3, load1: float = 1.0, rank_cpu: float = 100.0,
               peak_share: float | None = None) -> None:
        """`mem_share`: NVML's used share of each GPU; `peak_share`: each rank's per-step allocator peak, of
        its GPU's 80 GiB, as its heartbeat reports it (None: the ranks report no GPU)."""
        gpus = []
        if gpu_util is not None:
            total = 80 * 2**30
            gpus = [{"index": i, "name": "H100", "util_pct": gpu_util, "temp_c": 60, "power_w": 300,
                     "mem_used_bytes": int(total * (mem_share or 0.5)), "mem_total_bytes": total} for i in range(self.world)]
        host_total = 64 * 2**30
        with open(self.paths.system, "a") as f:
            f.write(dumps({"v": 1, "t": self.now, "nvml": gpu_util is not None, "nvml_error": None, "gpus": gpus,
                           "ranks": [{"rank": r, "pid": p, "cpu_pct": rank_cpu, "rss_bytes": 2**30, "alive": True,
                                      **(_on_gpu(r, peak_share) if peak_share is not None else {})}
                                     for r, p in self.pids.items()],
                           "host": {"cpu_pct": 50.0, "mem_used_bytes": int(host_total * host_mem_share),
                                    "mem_total_bytes": host_total, "load1": load1}}) + "\n")

    def idle(self, seconds: float, every: float = 1.0, **sample: Any) -> None:
        """Simulated time passes with no step; the monitor polls every `every` seconds."""
        end = self.now + seconds
        while self.now + every <= end + 1e-9:
            self.now += every
            if sample:
                self.sample(**sample)
            self.poll()

    def poll(self) -> list[dict[str, Any]]:
        got = self.monitor.poll(now=self.now)
        self.records += got
        return got

    # -- reading back ----------------------------------------------------------------------
    def opened(self, code: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.records if r["status"] == "open" and (code is None or r["code"] == code)]

    def closed(self, code: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.records if r["status"] == "closed" and (code is None or r["code"] == code)]

    def file(self) -> list[dict[str, Any]]:
        return read_events(self.paths.incidents)

    def warn_or_error(self) -> list[dict[str, Any]]:
        return [r for r in self.opened() if r["severity"] in ("warn", "error")]
