"""What the TensorBoard mirror costs the supervisor: CPU with and without it, side by side.

    .venv/bin/python bench/mirror_cost.py [--seconds 60] [--rate 100] [--wandb | --only-wandb] [--wandb-every N]

A writer process appends a synthetic run's events at --rate steps/s (an eval every 100 steps)
and a system sample (2 ranks) once a second to two run directories. Two tick processes follow
one each, as the supervisor does once a second (its one events tail, read_new); one also
polls the mirror with those records (tui/mirror/mirror.py MirrorHook, [monitor] tensorboard). Each reports its
CPU time (all threads: the event-file writer's too) over the same wall time; the difference is
the mirror's cost. Goal: <= 1% of a core at 100 steps/s. --wandb: the mirrored process mirrors
into W&B too (offline, files in a temporary folder), its service process's CPU counted, measured
from when wandb.init has returned; --only-wandb: W&B without the TensorBoard mirror; --wandb-every N: [monitor] wandb.every_steps (each Nth training
step into W&B; the rows W&B's offline file holds are read back with wandb's reader and counted).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mt.contract.events import dumps, make_event
from mt.contract.paths import RunPaths
from mt.contract.preset import config_from_dict
from mt.contract.records import RecordTail


def _line(kind: str, **fields: object) -> str:
    return dumps(make_event(kind, **fields)) + "\n"


def writer(dirs: list[Path], seconds: float, rate: float) -> None:
    files = [open(RunPaths(d).events, "a", buffering=1) for d in dirs]
    systems = [open(RunPaths(d).system, "a", buffering=1) for d in dirs]
    start = _line("run_start", run_id="r", attempt=1, world_size=2, nnodes=1, device="cpu", backend="gloo",
                  precision="fp32", config={}, params_total=1, params_trainable=1, tokens_per_step=4096,
                  effective_batch=32, static_mem_bytes=0, start_step=0, max_steps=10**9, resumed_from=None,
                  torch_version="2", git_commit=None)
    for f in files:
        f.write(start)
    t0 = time.monotonic()
    step, next_sample = 0, t0
    while time.monotonic() - t0 < seconds:
        step += 1
        line = _line("step", step=step, epoch=0, loss=3.0 / (1 + step * 1e-3), lr=1e-3, grad_norm=0.8, clipped=False,
                     tokens_per_s=8192.0, step_time_s=0.01, data_wait_s=0.001, samples_seen=32 * step,
                     tokens_seen=4096 * step, skipped=False, mem_alloc_bytes=0, mem_peak_bytes=0)
        if step % 100 == 0:
            line += _line("eval", step=step, val_loss=3.1)
        for f in files:
            f.write(line)
        now = time.monotonic()
        if now >= next_sample:
            next_sample += 1.0
            sample = json.dumps({"v": 1, "t": time.time(), "nvml": False, "gpus": [], "host": {"cpu_pct": 10.0},
                                 "ranks": [{"rank": r, "pid": 1, "cpu_pct": 99.0, "rss_bytes": 10**9, "alive": True} for r in (0, 1)]})
            for f in systems:
                f.write(sample + "\n")
        time.sleep(max(0.0, t0 + step / rate - time.monotonic()))


def _cpu() -> float:
    """This process's CPU time and its children's (W&B's service process)."""
    import psutil

    kids = psutil.Process().children(recursive=True)
    return time.process_time() + sum(sum(k.cpu_times()[:2]) for k in kids if k.is_running())


def tick(run_dir: Path, seconds: float, mirror: bool, wandb: bool, every: int, tb: bool = True) -> None:
    from tui.mirror.mirror import MirrorHook

    paths = RunPaths(run_dir)
    monitor: dict[str, object] = {"tensorboard": "tb" if mirror and tb else ""}
    if mirror and wandb:
        os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(run_dir), WANDB_SILENT="true")
        monitor["wandb"] = {"project": "bench", "mode": "offline", "every_steps": every}
    cfg = config_from_dict({"run": {"name": "b"}, "monitor": monitor}, "bench")
    events, hook = RecordTail(paths.events), MirrorHook(paths, cfg, logging.getLogger("bench"))
    c0 = _cpu()
    hook.poll([], (0, None))  # the first poll imports tensorboard and opens the files: once per supervisor
    if "wandb" in hook.mirrors:
        hook.mirrors["wandb"].sink.started.wait(120)
    start_s = _cpu() - c0
    c0, t0 = _cpu(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(1.0)
        news = events.read_new()  # what the supervisor reads anyway, handed to the mirror as it does
        hook.poll(news, (events.line_offset, events.ino))
    cpu_s, wall_s = _cpu() - c0, time.monotonic() - t0
    hook.close()
    print(json.dumps({"cpu_s": cpu_s, "wall_s": wall_s, "start_s": start_s, "steps": _steps(run_dir, mirror and tb),
                      "wandb_steps": _wandb_steps(run_dir) if mirror and wandb else None}))


def _steps(run_dir: Path, mirror: bool) -> int | None:
    if not mirror:
        return None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return len(acc.Scalars("train/loss"))


def _wandb_steps(run_dir: Path) -> int:
    """Training rows (train/loss) in W&B's offline files, read back with wandb's own reader."""
    from tests.mirror.wbread import offline_runs, series

    return len(series(offline_runs(run_dir / "wandb"), "train/loss"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--role", choices=("main", "writer", "tick"), default="main")
    ap.add_argument("--mirror", action="store_true")
    ap.add_argument("--wandb", action="store_true", help="mirror into W&B (offline) too")
    ap.add_argument("--only-wandb", action="store_true", help="mirror into W&B (offline) only, no TensorBoard")
    ap.add_argument("--no-tb", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--wandb-every", type=int, default=1, help="[monitor] wandb.every_steps")
    ap.add_argument("dirs", nargs="*", type=Path)
    a = ap.parse_args()
    if a.role == "writer":
        return writer(a.dirs, a.seconds, a.rate)
    if a.role == "tick":
        return tick(a.dirs[0], a.seconds, a.mirror, a.wandb, a.wandb_every, tb=not a.no_tb)
    a.wandb = a.wandb or a.only_wandb
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / n for n in ("plain", "mirrored")]
        for d in dirs:
            d.mkdir()
        me = [sys.executable, __file__, "--seconds", str(a.seconds), "--rate", str(a.rate)]
        w = subprocess.Popen([*me, "--role", "writer", *map(str, dirs)], cwd=REPO)
        ticks = {name: subprocess.Popen([*me, "--role", "tick", *(["--mirror"] + (["--wandb", "--wandb-every", str(a.wandb_every)] if a.wandb else []) + (["--no-tb"] if a.only_wandb else []) if name == "mirrored" else []), str(d)],
                                        stdout=subprocess.PIPE, text=True, cwd=REPO)
                 for name, d in zip(("plain", "mirrored"), dirs)}
        got = {name: json.loads(p.communicate()[0]) for name, p in ticks.items()}
        w.wait()
        steps = sum(1 for line in open(RunPaths(dirs[0]).events) if '"step"' in line and '"kind":"step"' in line.replace(" ", ""))
    for name, r in got.items():
        print(f"{name:9s} cpu {r['cpu_s']:.3f} s over {r['wall_s']:.1f} s = {100 * r['cpu_s'] / r['wall_s']:.2f}% of a core"
              f" (first poll, once: {r['start_s']:.2f} s)"
              + (f"; {r['steps']} steps in TensorBoard of {steps} written" if r["steps"] is not None else "")
              + (f"; {r['wandb_steps']} in W&B (every {a.wandb_every})" if r.get("wandb_steps") is not None else ""))
    extra = got["mirrored"]["cpu_s"] / got["mirrored"]["wall_s"] - got["plain"]["cpu_s"] / got["plain"]["wall_s"]
    print(f"mirror: +{100 * extra:.2f}% of a core at {a.rate:g} steps/s (goal <= 1%)")


if __name__ == "__main__":
    main()
