"""What the mt library costs a training script: `import mt`, one `run.step`, and a real CPU loop.

    .venv/bin/python bench/library_overhead.py [--steps 10] [--pairs 2000] [--repeat 5]

1. `import mt` in a fresh interpreter (`-X importtime`, cumulative µs of the mt package), median;
   alone, and after `import torch` (what a training script pays: torch loads pathlib & co. first).
2. `run.step(...)` on rank 0 of a one-process run (events, heartbeat, control poll; no collective):
   CPU per call of the whole process (the heartbeat thread writes the batched steps and runs the
   rules), and of the calling thread alone.
3. The tiny CPU loop of examples/script/train.py (one process), short blocks of steps with and
   without `run.step`, paired in random order: tokens/s (wall) with/without, the issue's measure,
   and tokens per CPU-second of the process (the library's thread included), each as the ratio of
   the sums with a 95% bootstrap interval; then the time inside `run.step` in steps of its own,
   beside an empty call timed the same way (what the timer itself costs right after a step).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def step_cost_us(n: int) -> tuple[float, float]:
    """CPU µs per run.step: the whole process's, and the calling thread's."""
    import mt

    with tempfile.TemporaryDirectory() as d:
        run = mt.init(runs_dir=d, name="bench")
        t0, c0 = time.process_time(), time.thread_time()
        for i in range(1, n + 1):
            run.step(i, loss=1.0 / i, lr=1e-3, grad_norm=0.5, tokens=1024)
        run.finish()  # writes what is still batched: part of the cost
        dt, dc = time.process_time() - t0, time.thread_time() - c0
    return dt / n * 1e6, dc / n * 1e6


def _interval(pairs: list[tuple[float, float]], rng: random.Random, n: int = 2000) -> tuple[float, float, float]:
    """sum(without) / sum(with) over block pairs, and its 95% bootstrap interval (pairs resampled)."""
    def ratio(ps: list[tuple[float, float]]) -> float:
        return sum(a for a, _ in ps) / sum(b for _, b in ps)
    boot = sorted(ratio(rng.choices(pairs, k=len(pairs))) for _ in range(n))
    return ratio(pairs), boot[int(0.025 * n)], boot[int(0.975 * n)]


def loop_ratio(steps: int, pairs: int) -> dict[str, Any]:
    """The example's loop with run.step against without, in short blocks paired in random order
    (a neighbour's burst or a drift of the host hits both sides alike): tokens/s by wall time and
    by the process's CPU time (the library's thread included), with 95% intervals; then, in blocks
    of their own (a timer around each call costs the loop too), the time inside run.step."""
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

    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as d:
        run = mt.init(runs_dir=d, name="bench")
        step = 0

        def block(with_mt: bool) -> tuple[float, float]:
            nonlocal step
            t0, w0 = time.process_time(), time.perf_counter()
            for _ in range(steps):
                step += 1
                loss, gn = one_step(step)
                if with_mt:
                    run.step(step, loss=loss, lr=1e-3, grad_norm=gn, tokens=B * T)
            return time.perf_counter() - w0, time.process_time() - t0

        for _ in range(3):
            block(True), block(False)  # warm-up
        wall: list[tuple[float, float]] = []
        cpu: list[tuple[float, float]] = []
        for _ in range(pairs):
            first = rng.random() < 0.5
            a = block(first)
            b = block(not first)
            off, on = (b, a) if first else (a, b)
            wall.append((off[0], on[0]))
            cpu.append((off[1], on[1]))
        def nothing(step: int, **metrics: float) -> None:  # the timer's own cost, cold, in the same place
            return None

        spent = {run.step: 0.0, nothing: 0.0}
        timed = max(1, pairs // 4) * steps
        for i in range(2 * timed):  # the mean over many steps: the thread's wakes are part of the cost
            step += 1
            loss, gn = one_step(step)
            call = run.step if i % 2 else nothing
            a0 = time.thread_time()  # CPU time: a preemption by a neighbour is not counted
            call(step, loss=loss, lr=1e-3, grad_norm=gn, tokens=B * T)
            spent[call] += time.thread_time() - a0
        run.finish()
    step_s = statistics.median(off for off, _ in cpu) / steps
    return {"wall": _interval(wall, rng), "cpu": _interval(cpu, rng), "inside_us": spent[run.step] / timed * 1e6,
            "timer_us": spent[nothing] / timed * 1e6, "step_us": step_s * 1e6}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10, help="steps per block")
    p.add_argument("--pairs", type=int, default=2000, help="block pairs (with, without) of the tiny loop")
    p.add_argument("--repeat", type=int, default=5, help="fresh interpreters for the import cost")
    args = p.parse_args()
    os.environ.pop("MT_RUN_DIR", None)
    print(f"import mt: {import_cost_us(args.repeat) / 1000:.1f} ms alone, "
          f"{import_cost_us(args.repeat, 'import torch; ') / 1000:.1f} ms after import torch "
          f"(median of {args.repeat}, -X importtime)")
    proc_us, thread_us = step_cost_us(200_000)  # long enough for the thread's ticks (every 0.25 s) to do the writing
    print(f"run.step, one rank, 200000 calls: {proc_us:.1f} µs of CPU per call, the heartbeat thread's writes and "
          f"rules included; {thread_us:.1f} µs in the calling thread")
    r = loop_ratio(args.steps, args.pairs)
    (wall, wlo, whi), (cpu, clo, chi) = r["wall"], r["cpu"]
    print(f"CPU tiny loop ({r['step_us']:,.0f} µs a step), with run.step / without, {args.pairs} pairs of "
          f"{args.steps}-step blocks: tokens/s {wall:.4f} (95% interval {wlo:.4f}-{whi:.4f}); tokens per CPU-second "
          f"of the process, the library's thread included, {cpu:.4f} ({clo:.4f}-{chi:.4f}); run.step itself "
          f"{r['inside_us']:.1f} µs in the training thread (mean, in steps of their own; an empty call timed the same "
          f"way: {r['timer_us']:.1f} µs)")

if __name__ == "__main__":
    main()
