"""What a checkpoint costs the loop: full vs sharded, blocking vs async, side by side in one script.

    .venv/bin/python bench/async_checkpoint.py [--nproc 2] [--layers 16] [--width 512] [--rounds 2]

The real engine (torchrun, gloo on CPU, train.strategy = "fsdp") trains mt's GPT (~50M parameters
at the defaults) and checkpoints every other step, once per variant per round, variants
interleaved (A B C A B C ...):
- full: model.pt/optim.pt/train.pt gathered to rank 0, blocking;
- sharded: DCP, each rank writes its shards, blocking;
- async: sharded with checkpoint.async = true.
Read from each run's `checkpoint` events: `seconds` (the whole write) and `blocking_s` (what the
loop waited). Goal: async blocking_s <= 0.2 x the blocking sharded save's seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mt.contract.jsonl import read_events
from mt.contract.preset import config_from_dict

VARIANTS = {
    "full": {"format": "full"},
    "sharded": {"format": "sharded"},
    "async": {"format": "sharded", "async": True},
}


def run_variant(tmp: Path, name: str, a: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    cfg = config_from_dict({
        "run": {"name": name, "seed": 0},
        "launch": {"nproc_per_node": a.nproc, "device": "cpu"},
        "model": {"vocab_size": 512, "n_layer": a.layers, "n_head": 8, "d_model": a.width, "seq_len": 32},
        "data": {"source": "synthetic", "synthetic_samples": 256, "val_fraction": 0.0},
        "train": {"strategy": "fsdp", "micro_batch_size": 1, "max_steps": a.steps, "warmup_steps": 0},
        "checkpoint": {"every_steps": 2, "keep_last": 1, **VARIANTS[name.split("-")[0]]},
    }, "bench")
    run = tmp / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.nproc}",
           "-m", "engine", "--run-dir", str(run)]
    subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return [e for e in read_events(run / "events.jsonl") if e["kind"] == "checkpoint"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    blocking: dict[str, list[float]] = {v: [] for v in VARIANTS}
    size = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for v in VARIANTS:
                saved = run_variant(Path(tmp), f"{v}-{r}", a, env)
                seconds[v] += [c["seconds"] for c in saved]
                blocking[v] += [c["blocking_s"] for c in saved]
                size = saved[-1]["bytes"]
                print(f"round {r + 1} {v:>7}: seconds {[c['seconds'] for c in saved]}, blocking_s {[c['blocking_s'] for c in saved]}", flush=True)
                shutil.rmtree(Path(tmp) / f"{v}-{r}", ignore_errors=True)  # 0.6 GB a run: do not keep them all
    med = {v: (statistics.median(seconds[v]), statistics.median(blocking[v])) for v in VARIANTS}
    print(f"\ncheckpoint of {size / 1e6:.0f} MB ({a.nproc} ranks, fsdp, gloo on CPU), medians over {a.rounds} rounds:")
    for v, (s, b) in med.items():
        print(f"  {v:>7}: seconds {s:.3f}  blocking_s {b:.3f}")
    print(f"sharded / full save seconds: {med['sharded'][0] / med['full'][0]:.3f}")
    print(f"async blocking_s / blocking sharded seconds: {med['async'][1] / med['sharded'][0]:.3f} (goal <= 0.2)")
    print(f"async blocking_s / full seconds: {med['async'][1] / med['full'][0]:.3f}")


if __name__ == "__main__":
    main()
