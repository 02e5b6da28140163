"""What the step anatomy costs a DDP step: 2 gloo ranks of a small model, with and without it.

    .venv/bin/python bench/step_anatomy.py [--blocks 8] [--steps 40] [--hidden 256]

Each rank runs the engine loop's shape (next batch, forward+backward under DDP, clip, the step's
small all-reduce, optimizer, heartbeat) in blocks of `--steps` steps, alternating: plain DDP and a
heartbeat without anatomy, then the same DDP model with engine/anatomy.py's StepClock (an autograd hook
on the first parameter's gradient, the laps, the medians in each heartbeat record). Two models, the same
weights, so both sides do the same work. Prints the median step of each side, the median of the
paired blocks' ratios (wall, and rank 0's CPU time, which a loaded machine disturbs less)
with a bootstrap 95% interval, and the anatomy's own calls per step timed alone (µs).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from engine.anatomy import StepClock
    from engine.parallel import Parallel
    from mt.contract.anatomy import StepAnatomy
    from mt.contract.heartbeat import Heartbeat

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    sides = {}
    for name in ("plain", "anatomy"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden), torch.nn.Tanh(),
                                  torch.nn.Linear(args.hidden, args.hidden))
        ddp = DDP(net)
        hb = Heartbeat(Path(out) / f"{name}{rank}", rank, 1)
        clock = None
        if name == "anatomy":
            hb.anatomy = StepAnatomy()
            clock = StepClock(Parallel(ddp, ddp.no_sync, "ddp"), torch.device("cpu"), hb.anatomy)
        sides[name] = (ddp, torch.optim.AdamW(net.parameters(), lr=1e-3), hb, clock)
    data = [torch.randn(32, args.hidden) for _ in range(16)]

    def block(name: str, step0: int) -> tuple[float, float]:
        """Wall and CPU seconds (this process, every thread) per step."""
        ddp, opt, hb, clock = sides[name]
        lap = clock.lap if clock else (lambda mark: None)
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(args.steps):
            lap("start")
            t = time.perf_counter()
            x = data[i % len(data)]
            data_s = time.perf_counter() - t
            ddp(x).square().mean().backward()
            lap("backward")
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            lap("agree_in")
            flag = torch.zeros(2)
            dist.all_reduce(flag)  # the engine's step agreement
            lap("agree_out")
            opt.step()
            opt.zero_grad(set_to_none=True)
            lap("optim")
            if clock:
                clock.end(data_s)
            hb.beat(step0 + i)
        return (time.perf_counter() - t0) / args.steps, (time.process_time() - c0) / args.steps

    rng = random.Random(1)
    block("plain", 0), block("anatomy", 0)  # warm-up
    rows, cpu_rows = [], []
    for b in range(args.blocks):
        order = ["plain", "anatomy"]
        rng.shuffle(order)
        dist.barrier()
        got = {name: block(name, b * args.steps) for name in order}
        rows.append((got["plain"][0], got["anatomy"][0]))
        cpu_rows.append((got["plain"][1], got["anatomy"][1]))
    # the anatomy's own calls alone, as a step makes them (no DDP): six laps, the end, one beat
    ddp, opt, hb, clock = sides["anatomy"]
    n = 2000
    t0 = time.perf_counter()
    for i in range(n):
        for mark in ("start", "ready", "backward", "agree_in", "agree_out", "optim"):
            clock.lap(mark)
        clock.end(1e-4)
        hb.beat(i)
    with_us = (time.perf_counter() - t0) / n * 1e6
    plain_hb = sides["plain"][2]
    t0 = time.perf_counter()
    for i in range(n):
        plain_hb.beat(i)
    beat_us = (time.perf_counter() - t0) / n * 1e6
    if rank == 0:
        plain = statistics.median(r[0] for r in rows)
        anat = statistics.median(r[1] for r in rows)
        # each block beside its pair (run back to back, in random order): a shared machine's slow spells
        # land on both sides of a pair more often than on one
        print(f"step: plain {plain * 1e3:.2f} ms, with anatomy {anat * 1e3:.2f} ms (medians of {args.blocks} blocks "
              f"of {args.steps} steps)")
        for what, pairs in (("wall", rows), ("rank 0's CPU", cpu_rows)):
            paired = [a / p for p, a in pairs]
            boot = random.Random(2)
            ratios = sorted(statistics.median(boot.choice(paired) for _ in paired) for _ in range(2000))
            print(f"ratio with/without, {what} per step (median of paired blocks): {statistics.median(paired):.4f}  "
                  f"95% CI [{ratios[50]:.4f}, {ratios[1949]:.4f}]")
        print(f"the anatomy's own calls per step: {with_us - beat_us:.1f} µs (laps + end + medians in the beat: "
              f"{with_us:.1f} µs, a beat without anatomy {beat_us:.1f} µs) = "
              f"{(with_us - beat_us) / 1e6 / plain * 100:.3f}% of a {plain * 1e3:.2f} ms step")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args()
    import torch.multiprocessing as mp

    port = random.Random(os.getpid()).randrange(20000, 40000)
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(args, port, out), nprocs=2)


if __name__ == "__main__":
    main()
