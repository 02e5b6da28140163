"""Generate a big synthetic run directory (default 1,000,000 step events, ~400 MB) for the viewer benchmarks.

Usage: python bench/watch_gen.py /tmp/bigrun [--steps N] [--no-index]

The binary index beside events.jsonl is built with the engine's own encoder
(`engine.eventindex.open_index`, what an EventWriter does when it opens a file it has not indexed).
"""
from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from mt.contract.eventindex import index_path, open_index
from mt.contract.events import dumps
from mt.contract.jsonl import write_json_atomic

T0 = 1_700_000_000.0


def step_line(step: int, t: float, rng: random.Random) -> str:
    loss = 5.5 * math.exp(-step / 200_000) + 1.5 + rng.gauss(0, 0.05)
    return dumps({
        "v": 1, "t": t, "kind": "step", "step": step, "epoch": step // 50_000,
        "loss": loss, "lr": 3e-4 * min(1.0, step / 2000), "grad_norm": abs(rng.gauss(0.8, 0.2)),
        "clipped": False, "tokens_per_s": 250_000.0 + rng.gauss(0, 5000), "step_time_s": 0.52,
        "data_wait_s": 0.003, "samples_seen": 512 * step, "tokens_seen": 524_288 * step,
        "skipped": False, "mem_alloc_bytes": 41_234_567_890, "mem_peak_bytes": 52_345_678_901,
        "gpu_util_pct": 97.5, "note": "padding to bring a line to a realistic ~400 bytes" + "." * 20,
    })


def generate(root: Path, steps: int, index: bool = True) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"run": {"name": "big"}, "train": {"max_steps": steps * 2, "grad_clip": 1.0}}))
    rng = random.Random(0)
    t = T0
    with open(root / "events.jsonl", "w") as f:
        f.write(dumps({"v": 1, "t": t, "kind": "run_start", "run_id": "big", "attempt": 1, "world_size": 8,
                       "nnodes": 1, "device": "cuda", "backend": "nccl", "precision": "bf16", "config": {},
                       "params_total": 124_000_000, "params_trainable": 124_000_000,
                       "tokens_per_step": 524_288, "effective_batch": 512, "static_mem_bytes": 0,
                       "start_step": 0, "max_steps": steps * 2, "resumed_from": None,
                       "torch_version": "2.13", "git_commit": None}) + "\n")
        buf = []
        for s in range(1, steps + 1):
            t += 0.52
            buf.append(step_line(s, t, rng))
            if s % 1000 == 0:
                buf.append(dumps({"v": 1, "t": t, "kind": "eval", "step": s, "val_loss": 1.6 + 5.5 * math.exp(-s / 200_000)}))
            if s % 50_000 == 0:
                buf.append(dumps({"v": 1, "t": t, "kind": "checkpoint", "step": s, "path": f"checkpoints/step-{s}",
                                  "bytes": 10**9, "seconds": 3.0, "reason": "interval", "request_id": None}))
            if len(buf) >= 10_000:
                f.write("\n".join(buf) + "\n")
                buf = []
        if buf:
            f.write("\n".join(buf) + "\n")
    index_path(root / "events.jsonl").unlink(missing_ok=True)
    if index:
        open_index(root / "events.jsonl", catch_up_bytes=1 << 40).close()
    write_json_atomic(root / "status.json", {"state": "running", "attempt": 1, "supervisor_pid": 1,
                                            "torchrun_pid": 2, "started": T0, "ended": None,
                                            "exit_code": None, "reason": None})


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--no-index", action="store_true", help="no engine index (a run from an older engine)")
    a = ap.parse_args()
    generate(a.root, a.steps, index=not a.no_index)
    print(a.root, (a.root / "events.jsonl").stat().st_size // 2**20, "MiB")
