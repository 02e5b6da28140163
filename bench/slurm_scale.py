"""The view of a job and its rules at scale, by simulation: N nodes x 8 ranks in the per-node layout.

    python bench/slurm_scale.py [--nodes 2,8,32,128] [--per-node 8] [--seconds 10] [--history 1000,100000]

For each N and each history (finished steps already in events.jsonl), a writer process
(tests/tui/jobdir.py, the contract's writers) advances the job: a step every 0.5 s (rank 0's
step event, every rank's heartbeat and a line in every rank log) and a system sample a second
per node. This process then follows it as `mt watch` does: the dashboard's `Watcher.poll` every
0.25 s (a job's nodes once a second, or less often where that would cost over 5% of a core:
`nodes read every`) and the system panel's text (`render_nodes`) every
0.5 s, for --seconds; then the job supervisor's rules (`IncidentMonitor.poll` over the whole run
directory) once a second for --seconds. It reports the node refresh's time, the viewer's CPU as
a share of one core, the rules' cost per tick, and the file-system calls of one node refresh, one
whole viewer poll and one rules tick (counted in-process: open, os.listdir, os.scandir through
sys.addaudithook, os.stat through a wrapper).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WRITER = r"""
import sys, time
from pathlib import Path
from tests.tui.jobdir import JobDir
root, n, per, history, seconds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
job = JobDir(root, [f"gpu-{k:03d}" for k in range(n)], per)
job.start()
t = time.time() - history * 0.5
for s in range(1, history + 1):   # the finished steps: rank 0's events only
    job.step(s, ranks=[], log=False, t=t + s * 0.5)
job.step(history)
job.sample()
print("ready", flush=True)
t0 = time.time(); step = history; next_sample = t0 + 1
while time.time() - t0 < seconds:
    step += 1
    job.step(step)
    if time.time() >= next_sample:
        job.sample()
        next_sample += 1
    time.sleep(max(0.0, t0 + (step - history) * 0.5 - time.time()))
job.close()
"""


class Calls:
    """File-system calls made while `on` (open, listdir, scandir from audit events; os.stat wrapped)."""

    def __init__(self) -> None:
        self.on = False
        self.counts: dict[str, int] = {}
        sys.addaudithook(self._hook)
        real = os.stat

        def stat(*a, **k):   # os.stat raises no audit event
            if self.on:
                self.counts["stat"] = self.counts.get("stat", 0) + 1
            return real(*a, **k)
        os.stat = stat

    def _hook(self, event: str, _args: tuple) -> None:
        if self.on and event in ("open", "os.listdir", "os.scandir"):
            self.counts[event] = self.counts.get(event, 0) + 1

    def count(self, fn):
        self.counts, self.on = {}, True
        try:
            fn()
        finally:
            self.on = False
        return dict(self.counts)


def measure(n: int, per: int, history: int, seconds: float, calls: Calls) -> dict:
    from mt.contract.config import MonitorConfig
    from tui.diagnose.monitor import IncidentMonitor
    from tui.read.watcher import Watcher
    from tui.widgets.system import render_nodes

    with tempfile.TemporaryDirectory(prefix="mt-scale-") as tmp:
        root = Path(tmp) / "job"
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(n), str(per), str(history),
                                   str(2 * seconds + 30)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
            w = Watcher(root)
            w.poll()   # the first read: the whole history, not a refresh
            w.poll()
            refresh, every = [], []
            c0, t0, next_draw = time.process_time(), time.monotonic(), 0.0
            while time.monotonic() - t0 < seconds:
                read, a = w._nodes_read, time.perf_counter()
                w.poll()   # the dashboard's worker: every 0.25 s; the nodes when Watcher says they are due
                if w._nodes_read != read:
                    refresh.append(time.perf_counter() - a)
                    every.append(w.nodes_every_s)
                if time.monotonic() >= next_draw:
                    render_nodes(w.nodes, time.time(), 14)
                    next_draw = time.monotonic() + 0.5
                time.sleep(0.25)
            cpu = (time.process_time() - c0) / (time.monotonic() - t0)
            node_calls = calls.count(w.job.poll)
            w._nodes_read = -1e9
            poll_calls = calls.count(w.poll)
            m = IncidentMonitor(root, MonitorConfig())
            m.poll()   # catches up with the history
            ticks, tick_cpu = [], []
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                a, ac = time.perf_counter(), time.process_time()
                m.poll()
                ticks.append(time.perf_counter() - a)
                tick_cpu.append(time.process_time() - ac)
                time.sleep(1.0)
            tick_calls = calls.count(m.poll)
            ranks = sum(len(v.ranks()) for v in w.nodes)
        finally:
            writer.kill()
            writer.wait()
    return {"nodes": n, "ranks": ranks, "history": history, "refresh_ms": 1000 * statistics.median(refresh),
            "every_s": statistics.median(every),
            "refresh_max_ms": 1000 * max(refresh), "viewer_cpu_pct": 100 * cpu,
            "tick_ms": 1000 * statistics.median(ticks), "tick_cpu_ms": 1000 * statistics.median(tick_cpu),
            "node_calls": node_calls, "poll_calls": poll_calls, "tick_calls": tick_calls}


def total(c: dict) -> str:
    return f"{sum(c.values())} ({', '.join(f'{k} {v}' for k, v in sorted(c.items()))})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,8,32,128")
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--history", default="1000,100000", help="finished steps in events.jsonl before following")
    args = ap.parse_args()
    calls = Calls()
    print("| nodes x ranks | finished steps | node refresh median / max | nodes read every | viewer CPU "
          "| rules tick wall / CPU | calls: node refresh | calls: viewer poll | calls: rules tick |")
    print("|---|---|---|---|---|---|---|---|---|")
    for history in (int(h) for h in args.history.split(",")):
        for n in (int(x) for x in args.nodes.split(",")):
            r = measure(n, args.per_node, history, args.seconds, calls)
            print(f"| {r['nodes']} x {args.per_node} ({r['ranks']}) | {history:,} | {r['refresh_ms']:.1f} / "
                  f"{r['refresh_max_ms']:.1f} ms | {r['every_s']:.2f} s | {r['viewer_cpu_pct']:.1f}% | {r['tick_ms']:.1f} / {r['tick_cpu_ms']:.1f} ms "
                  f"| {total(r['node_calls'])} | {total(r['poll_calls'])} | {total(r['tick_calls'])} |", flush=True)


if __name__ == "__main__":
    main()
