"""A data-poisoned run recovers unattended with `train.on_nan = "rollback"`: its final loss against
runs that never saw the poisoned samples.

    .venv/bin/python bench/rollback_poisoned.py [--steps 200] [--seeds 3]

Every run is a real `mt launch --headless` (one CPU rank, the supervisor, bench/poisoned.py's
regression: 8,192 samples, global batch 32, so 200 steps stay inside the first epoch). The
poisoned run plants three samples whose input is inf at order positions met at steps 41, 91 and
151 (a non-finite loss each time), with checkpoints every 20 steps: each NaN ends the attempt,
the next continues from the checkpoint before it, skipping every batch through the bad step.
The clean runs are the same data without the poison, at `--seeds` seeds (the poisoned run's
seed first): the noise is their spread. Measured: each run's final `val_loss` (1,024 clean
held-out samples, evaluated at the last step), the rollbacks made, and the wall time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from poisoned import order

from mt.contract.jsonl import read_events

BATCH, N = 32, 8192
BAD_STEPS = (41, 91, 151)


def preset(runs: Path, name: str, seed: int, steps: int, poison: list[int]) -> str:
    args = f'{{ n = {N}, poison = {json.dumps(poison)}, kind = "nan", val_n = 1024 }}'
    return f"""[run]
name = "{name}"
runs_dir = "{runs}"
seed = {seed}
workdir = "{REPO / 'bench'}"
[launch]
nproc_per_node = 1
device = "cpu"
[model]
kind = "python"
factory = "poisoned:model"
args = {{ hidden = 64 }}
[data]
source = "python"
factory = "poisoned:build"
args = {args}
[train]
micro_batch_size = {BATCH}
max_steps = {steps}
lr = 3e-3
min_lr = 3e-4
warmup_steps = 10
eval_every = {steps}
eval_batches = {1024 // BATCH}
on_nan = "rollback"
rollback_budget = 5
[checkpoint]
every_steps = 20
keep_last = 3
"""


def launch(tmp: Path, name: str, seed: int, steps: int, poison: list[int]) -> dict:
    runs = tmp / "runs"
    path = tmp / f"{name}.toml"
    path.write_text(preset(runs, name, seed, steps, poison))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(path), "--headless", "--every", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    run_dir = next(runs.glob(f"{name}-*"))
    evs = read_events(run_dir / "events.jsonl")
    status = json.loads((run_dir / "status.json").read_text())
    if res.returncode != 0 or status["state"] != "completed":
        raise SystemExit(f"{name}: {status['state']}: {status.get('reason')}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return {
        "name": name, "seed": seed, "wall_s": round(wall, 1), "attempts": status["attempt"],
        "val_loss": [e["val_loss"] for e in evs if e["kind"] == "eval"][-1],
        "final_loss": [e["loss"] for e in evs if e["kind"] == "step"][-1],
        "rollbacks": [{k: e[k] for k in ("step", "to_step", "skip_batches", "by", "count")} for e in evs if e["kind"] == "rollback"],
        "nan_steps": [e["step"] for e in evs if e["kind"] == "incident" and e["code"] == "nan_loss"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    seed = 7
    poison = order(N, seed, [(s - 1) * BATCH + 5 for s in BAD_STEPS])  # the 6th sample of each bad step
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        poisoned = launch(tmp, "poisoned", seed, a.steps, poison)
        clean = [launch(tmp, f"clean{i}", seed + i, a.steps, []) for i in range(a.seeds)]
    spread = statistics.stdev(c["val_loss"] for c in clean) if len(clean) > 1 else float("nan")
    mean = statistics.fmean(c["val_loss"] for c in clean)
    out = {
        "poisoned": poisoned, "clean": clean, "clean_val_mean": mean, "clean_val_stdev": spread,
        "poisoned_minus_clean_same_seed": poisoned["val_loss"] - clean[0]["val_loss"],
        "poisoned_in_stdevs": (poisoned["val_loss"] - mean) / spread if spread else None,
        "extra_wall_s": round(poisoned["wall_s"] - clean[0]["wall_s"], 1),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
