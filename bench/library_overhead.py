"""What the mt library costs a training script: `import mt`, one `run.step`, and a real CPU loop.

    .venv/bin/python bench/library_overhead.py [--steps 100] [--pairs 30] [--repeat 5]

1. `import mt` in a fresh interpreter (`-X importtime`, cumulative µs of the mt package), median;
   alone, and after `import torch` (what a training script pays: torch loads pathlib & co. first).
2. `run.step(...)` on rank 0 of a one-process run (events, heartbeat, control poll; no collective).
3. The tiny CPU loop of examples/script/train.py (one process), blocks of steps with and without
   `run.step` in pairs (ABBA...): tokens/s (wall) with/without, the issue's measure; tokens per
   CPU-second of the process (the library's thread included), the library's whole cost and less
   disturbed by the neighbours' load; and the time inside `run.step` as a share of the step.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def import_cost_us(repeat: int, before: str = "") -> float:
    """Median cumulative import time of the `mt` package in a fresh interpreter (after `before`)."""
    out = []
    for _ in range(repeat):
        # `import mt` loads the library on first use (mt.init): both are what a script pays
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", f"{before}import mt; mt.init"],
                             capture_output=True, text=True, check=True, cwd=REPO).stderr
        total = 0.0
        for line in err.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[2].strip() in ("mt", "mt.run") and parts[2][1:3] != "  ":
                total += float(parts[1])  # the top-level entries: each includes what it imported
        out.append(total)
    return statistics.median(out)


def step_cost_us(n: int) -> float:
    import mt

    with tempfile.TemporaryDirectory() as d:
        run = mt.init(runs_dir=d, name="bench")
        t0 = time.process_time()
        for i in range(1, n + 1):
            run.step(i, loss=1.0 / i, lr=1e-3, grad_norm=0.5, tokens=1024)
        run.finish()  # writes what is still batched: part of the cost
        dt = time.process_time() - t0
    return dt / n * 1e6


def loop_ratio(steps: int, repeat: int) -> tuple[float, ...]:
    """The example's loop with run.step against without: the median tokens/s ratio and its quartiles
    by wall time and by the process's CPU time, µs in run.step, µs a step."""
    import torch
    import torch.nn.functional as F

    import mt

    torch.set_num_threads(1)
    V, B, T = 256, 16, 64
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(V, 64), torch.nn.Linear(64, V))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rule = torch.randperm(V)

    def one_step(step: int) -> tuple[float, float]:
        g = torch.Generator().manual_seed(step)
        x = torch.randint(V, (B, T), generator=g)
        loss = F.cross_entropy(model(x).flatten(0, 1), rule[x].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item(), gn.item()

    with tempfile.TemporaryDirectory() as d:
        run = mt.init(runs_dir=d, name="bench")
        for s in range(1, 21):
            one_step(s)  # warm-up
        # CPU time of this process (its heartbeat thread included): what the library costs the
        # script, far less disturbed by other processes on a shared machine than wall time.
        # Pairs of adjacent blocks, in ABBA order so a drift cancels; the median pair ratio.
        ratios, walls, inside, per_step = [], [], [], []
        step = 0
        for r in range(repeat):
            cpu: dict[bool, float] = {}
            wall: dict[bool, float] = {}
            for with_mt in ((False, True) if r % 2 == 0 else (True, False)):
                t0, w0, spent = time.process_time(), time.perf_counter(), 0.0
                for _ in range(steps):
                    step += 1
                    loss, gn = one_step(step)
                    if with_mt:
                        a = time.thread_time()  # CPU time: a preemption by a neighbour is not counted
                        run.step(step, loss=loss, lr=1e-3, grad_norm=gn, tokens=B * T)
                        spent += time.thread_time() - a
                cpu[with_mt] = time.process_time() - t0
                wall[with_mt] = time.perf_counter() - w0
                if with_mt:
                    inside.append(spent / steps)
                    per_step.append(cpu[with_mt] / steps)
            ratios.append(cpu[False] / cpu[True])
            walls.append(wall[False] / wall[True])
        run.finish()
    q, qw = statistics.quantiles(ratios, n=4), statistics.quantiles(walls, n=4)
    return (statistics.median(walls), qw[0], qw[2], statistics.median(ratios), q[0], q[2],
            statistics.median(inside) * 1e6, statistics.median(per_step) * 1e6)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100, help="steps per block")
    p.add_argument("--pairs", type=int, default=30, help="block pairs (with, without) of the tiny loop")
    p.add_argument("--repeat", type=int, default=5, help="fresh interpreters for the import cost")
    args = p.parse_args()
    os.environ.pop("MT_RUN_DIR", None)
    print(f"import mt: {import_cost_us(args.repeat) / 1000:.1f} ms alone, "
          f"{import_cost_us(args.repeat, 'import torch; ') / 1000:.1f} ms after import torch "
          f"(median of {args.repeat}, -X importtime)")
    print(f"run.step, one rank: {step_cost_us(20000):.1f} µs per call (20000 calls)")
    wall, wlo, whi, ratio, lo, hi, inside, step_us = loop_ratio(args.steps, args.pairs)
    print(f"CPU tiny loop ({step_us:,.0f} µs a step), with run.step / without, median of {args.pairs} block pairs: "
          f"tokens/s {wall:.3f} (quartiles {wlo:.3f}-{whi:.3f}); tokens per CPU-second of the process, "
          f"the library's thread included, {ratio:.3f} ({lo:.3f}-{hi:.3f}); run.step itself {inside:.1f} µs "
          f"in the training thread = {1 - inside / step_us:.4f} of the step left to the script")


if __name__ == "__main__":
    main()
