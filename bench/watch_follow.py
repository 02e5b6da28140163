"""CPU cost of following a live run that writes 100 step events a second.

    python bench/watch_follow.py [--seconds 30] [--rate 100] [--runs 2]

A writer process appends step events (and a system.jsonl sample a second); the dashboard
runs headless at 140x44 with its default poll and redraw rates in another process, which
reports its own CPU time (user + sys, all threads) over the measured window. `--runs N`
(N > 1): N such runs, each with its own writer at --rate, overlaid in the compare view
(`mt watch A B ...`).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WRITER = r"""
import math, os, sys, time
from mt.contract.events import dumps
root, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
ev_f = open(os.path.join(root, "events.jsonl"), "a"); sys_f = open(os.path.join(root, "system.jsonl"), "a")
t0 = time.time(); step = 0; next_sys = t0
while time.time() - t0 < seconds:
    now = time.time()
    due = int((now - t0) * rate)
    while step < due:
        step += 1
        ev_f.write(dumps({"v": 1, "t": now, "kind": "step", "step": step, "epoch": 0,
            "loss": 2 + 3 * math.exp(-step / 2000) + 0.05 * math.sin(step), "lr": 3e-4, "grad_norm": 0.7,
            "clipped": False, "tokens_per_s": 50000.0, "step_time_s": 0.01, "data_wait_s": 0.001,
            "samples_seen": step * 32, "tokens_seen": step * 4096, "skipped": False,
            "mem_alloc_bytes": 0, "mem_peak_bytes": 0}) + "\n")
    ev_f.flush()
    if now >= next_sys:
        next_sys += 1
        sys_f.write(dumps({"v": 1, "t": now, "nvml": False, "nvml_error": "no NVML", "gpus": [],
            "ranks": [{"rank": 0, "pid": os.getpid(), "cpu_pct": 99.0, "rss_bytes": 4e8, "alive": True}],
            "host": {"cpu_pct": 50.0, "mem_used_bytes": 4e9, "mem_total_bytes": 16e9, "load1": 1.0}}) + "\n")
        sys_f.flush()
    time.sleep(0.02)
"""

APP = r"""
import asyncio, resource, sys, time
from pathlib import Path
warmup, seconds, roots = float(sys.argv[1]), float(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
async def main():
    if len(roots) == 1:
        from tui.view.app import MtApp
        app = MtApp(roots[0]); watchers = [app.watcher]
    else:
        from tui.view.compare import CompareApp
        app = CompareApp(roots); watchers = app.watchers
    steps = lambda: sum(w.follower.state.step or 0 for w in watchers)
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause(warmup)
        c0, w0, s0 = cpu(), time.perf_counter(), steps()
        await pilot.pause(seconds)
        c1, w1, s1 = cpu(), time.perf_counter(), steps()
    print({"cpu_pct_of_one_core": 100 * (c1 - c0) / (w1 - w0), "window_s": w1 - w0,
           "events_followed": s1 - s0, "events_per_s": (s1 - s0) / (w1 - w0)})
asyncio.run(main())
"""


def new_run(root: Path) -> None:
    """A run directory a writer can append to: config and run_start."""
    from mt.contract.events import dumps
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"run": {"name": root.name}, "train": {"max_steps": 10**7}}))
    with open(root / "events.jsonl", "w") as f:
        f.write(dumps({"v": 1, "t": time.time(), "kind": "run_start", "run_id": "f", "attempt": 1,
                       "world_size": 1, "nnodes": 1, "device": "cpu", "backend": "gloo", "precision": "fp32",
                       "config": {}, "params_total": 1, "params_trainable": 1, "tokens_per_step": 4096,
                       "effective_batch": 32, "static_mem_bytes": 0, "start_step": 0, "max_steps": 10**7,
                       "resumed_from": None, "torch_version": "", "git_commit": None}) + "\n")


def mark_running(root: Path, writer_pid: int) -> None:
    """status.json as a supervisor would write it, with the writer as the live supervisor."""
    from mt.contract.jsonl import write_json_atomic
    write_json_atomic(root / "status.json", {"state": "running", "attempt": 1, "supervisor_pid": writer_pid,
                                             "torchrun_pid": None, "started": time.time(), "ended": None,
                                             "exit_code": None, "reason": None})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=100.0, help="step events a second, per run")
    ap.add_argument("--runs", type=int, default=1, help="runs followed at once (> 1: the compare view)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    base = Path(tempfile.mkdtemp(prefix="mt-follow-"))
    roots = [base] if a.runs == 1 else [base / f"run-{i}" for i in range(a.runs)]
    total = a.warmup + a.seconds + 10
    writers = []
    try:
        for root in roots:
            new_run(root)
            writers.append(subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(a.rate), str(total)],
                                            cwd=ROOT))
            mark_running(root, writers[-1].pid)
        out = subprocess.run([sys.executable, "-c", APP, str(a.warmup), str(a.seconds), *map(str, roots)],
                             cwd=ROOT, capture_output=True, text=True, timeout=total + 60)
    finally:
        for w in writers:
            w.kill()
            w.wait()
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    res = eval(out.stdout.strip().splitlines()[-1])
    res = {k: round(v, 2) for k, v in res.items()}
    res["runs"] = a.runs
    with open("/proc/loadavg") as f:
        res["loadavg"] = f.read().split()[:3]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
