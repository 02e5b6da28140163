"""What the mt library costs a training script: `import mt`, one `run.step`, and a real CPU loop.

    .venv/bin/python bench/library_overhead.py [--steps 300] [--repeat 5]

1. `import mt` in a fresh interpreter (`-X importtime`, cumulative µs of the mt package), median;
   alone, and after `import torch` (what a training script pays: torch loads pathlib & co. first).
2. `run.step(...)` on rank 0 of a one-process run (events, heartbeat, control poll; no collective).
3. The tiny CPU loop of examples/script/train.py (one process), blocks of steps with and without
   `run.step` alternating in one process (ABAB...), tokens per CPU-second of the process (its
   heartbeat thread included) with/without: the library's cost, not the neighbours' load.
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


def loop_ratio(steps: int, repeat: int) -> tuple[float, float, float]:
    """tokens/s of the example's loop with run.step over without, blocks alternating."""
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
        # script, far less disturbed by other processes on a shared machine than wall time
        rates: dict[bool, list[float]] = {True: [], False: []}
        step = 0
        for _ in range(repeat):
            for with_mt in (False, True):
                t0 = time.process_time()
                for _ in range(steps):
                    step += 1
                    loss, gn = one_step(step)
                    if with_mt:
                        run.step(step, loss=loss, lr=1e-3, grad_norm=gn, tokens=B * T)
                rates[with_mt].append(steps * B * T / (time.process_time() - t0))
        run.finish()
    with_, without = statistics.median(rates[True]), statistics.median(rates[False])
    return with_ / without, with_, without


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    os.environ.pop("MT_RUN_DIR", None)
    print(f"import mt: {import_cost_us(args.repeat) / 1000:.1f} ms alone, "
          f"{import_cost_us(args.repeat, 'import torch; ') / 1000:.1f} ms after import torch "
          f"(median of {args.repeat}, -X importtime)")
    print(f"run.step, one rank: {step_cost_us(20000):.1f} µs per call (20000 calls)")
    ratio, w, wo = loop_ratio(args.steps, args.repeat)
    print(f"CPU tiny loop: with run.step {w:,.0f} tok/CPU-s, without {wo:,.0f} tok/CPU-s, ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
