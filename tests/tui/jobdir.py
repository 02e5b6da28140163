"""A job's shared run directory (nodes/<node>/) written with the contract's own writers.

Heartbeats through mt/contract/heartbeat.py `Heartbeat`, statuses through `write_status` /
`write_status(..., node_only=True)`, system samples as `SystemSampler` makes them (appended as the supervisor
does), events through synth's `event_line`, rank logs appended. Used by the job-view tests and
bench/slurm_scale.py.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from mt.contract.anatomy import StepAnatomy
from mt.contract.events import dumps
from mt.contract.heartbeat import Heartbeat
from mt.contract.paths import RunPaths
from mt.contract.status import Status, write_status
from tests.tui.synth import event_line


class JobDir:
    """`nodes` x `per_node` ranks (global rank = node index x per_node + local rank)."""

    def __init__(self, root: Path, nodes: list[str], per_node: int, max_steps: int = 10**6,
                 name: str = "job") -> None:
        self.paths = RunPaths(root)
        self.nodes, self.per_node = nodes, per_node
        root.mkdir(parents=True, exist_ok=True)
        cfg = {"run": {"name": name}, "train": {"max_steps": max_steps},
               "launch": {"nnodes": len(nodes), "nproc_per_node": per_node}}
        self.paths.config.write_text(json.dumps(cfg))
        self.max_steps = max_steps
        self.beats: dict[int, Heartbeat] = {}
        self.templates: dict[str, dict[str, Any]] = {}
        self._events = open(self.paths.events, "a", encoding="utf-8")
        self._logs: dict[int, Any] = {}

    def ranks_of(self, node: str) -> list[int]:
        k = self.nodes.index(node)
        return list(range(k * self.per_node, (k + 1) * self.per_node))

    def node_of(self, rank: int) -> str:
        return self.nodes[rank // self.per_node]

    @property
    def world(self) -> int:
        return len(self.nodes) * self.per_node

    def start(self, pids: dict[int, int] | None = None, sampled: bool = True) -> None:
        """Statuses (job and nodes) `running`, every rank's heartbeat at step 0, run_start, and
        (`sampled`) each node's sample template from a SystemSampler. `pids`: rank -> a live
        process (default: this one)."""
        from tui.supervise.sampler import SystemSampler

        sampler = SystemSampler() if sampled else None
        try:
            self._start(pids or {r: os.getpid() for r in range(self.world)}, sampler)
        finally:
            if sampler is not None:
                sampler.close()

    def _start(self, pids: dict[int, int], sampler: Any) -> None:
        now = time.time()
        # the job's status names its nodes, as the job's supervisor records Slurm's list
        write_status(self.paths, Status(state="running", attempt=1, supervisor_pid=os.getpid(), started=now,
                                        nnodes=len(self.nodes), nproc=self.per_node, node_rank=0,
                                        job_nodes=list(self.nodes)))
        for k, node in enumerate(self.nodes):
            mine = {r: pids[r] for r in self.ranks_of(node)}
            self.paths.on(node).here.mkdir(parents=True, exist_ok=True)   # the node's supervisor makes it
            write_status(self.paths.on(node), Status(
                state="running", attempt=1, supervisor_pid=os.getpid(), started=now, nnodes=len(self.nodes),
                nproc=self.per_node, node_rank=k, worker_pids={str(r): p for r, p in mine.items()}), node_only=True)
            for r in mine:
                self.beats[r] = Heartbeat(self.paths.on(node).heartbeat(r), r, 1)
                self.beats[r].beat(0, "start")
            if sampler is not None:
                self.templates[node] = sampler.sample(mine)
        self.event("run_start", run_id="job1", attempt=1, world_size=self.world, nnodes=len(self.nodes),
                   device="cpu", backend="gloo", precision="fp32", config={}, params_total=1000,
                   params_trainable=1000, tokens_per_step=4096, effective_batch=8 * self.world,
                   static_mem_bytes=0, start_step=0, max_steps=self.max_steps, resumed_from=None,
                   torch_version="2.13", git_commit=None)

    def event(self, kind: str, t: float | None = None, **fields: Any) -> None:
        self._events.write(event_line(kind, time.time() if t is None else t, **fields) + "\n")
        self._events.flush()

    def step(self, step: int, ranks: list[int] | None = None, log: bool = True, t: float | None = None) -> None:
        """Rank 0's step event, a heartbeat of each rank in `ranks` (default: all), a line in each rank log."""
        self.event("step", t, step=step, epoch=0, loss=3.0 - step * 1e-5, lr=1e-3, grad_norm=0.5, clipped=False,
                   tokens_per_s=8192.0, step_time_s=0.5, data_wait_s=0.01, samples_seen=8 * step,
                   tokens_seen=4096 * step, skipped=False, mem_alloc_bytes=0, mem_peak_bytes=0)
        for r in range(self.world) if ranks is None else ranks:
            self.beats[r].beat(step)
            if log:
                self.log(r, f"step {step} done\n")

    def anatomy(self, parts: dict[int, dict[str, float]], steps: int = 20) -> None:
        """Each rank's heartbeat carries these step parts from its next beat on (`steps` steps of them, as the engine's StepClock adds)."""
        for r, p in parts.items():
            a = StepAnatomy(refresh=1)
            for _ in range(steps):
                a.add(**p)
            self.beats[r].anatomy = a

    def log(self, rank: int, text: str) -> None:
        f = self._logs.get(rank)
        if f is None:
            path = self.paths.on(self.node_of(rank)).rank_log(rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self._logs[rank] = open(path, "a", encoding="utf-8")
        f.write(text)
        f.flush()

    def sample(self, now: float | None = None, alive: dict[int, bool] | None = None,
               nodes: list[str] | None = None) -> None:
        """One system sample per node (`nodes`: those only; a lost node's supervisor samples no more),
        the SystemSampler's record with a new time (and `alive` overrides)."""
        for node, tmpl in self.templates.items():
            if nodes is not None and node not in nodes:
                continue
            rec = {**tmpl, "t": time.time() if now is None else now,
                   "ranks": [{**e, "alive": (alive or {}).get(e["rank"], e["alive"])} for e in tmpl["ranks"]]}
            with open(self.paths.on(node).system, "a", encoding="utf-8") as f:   # as Supervisor.append_sample
                f.write(dumps(rec) + "\n")

    def close(self) -> None:
        self._events.close()
        for f in self._logs.values():
            f.close()


def two_nodes(root: Path, steps: int = 5, gap_s: float = 0.0) -> JobDir:
    """A live 2-node job, 2 ranks a node (ranks 0-1 on n1, 2-3 on n2), `steps` steps `gap_s` apart, sampled."""
    job = JobDir(root, ["n1", "n2"], 2)
    job.start()
    for s in range(1, steps + 1):
        job.step(s)
        time.sleep(gap_s)
    job.sample()
    return job
