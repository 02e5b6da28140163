"""Where the time before the first step goes: `mt launch --headless` vs `python train.py`, one rank.

    .venv/bin/python bench/startup.py [--repeat 3]

Alternates a plain single-process script (the same model, data and first optimizer step as the
preset) with `mt launch --headless` of that preset, twice into the same runs folder (A: the
first launch, which checks the factories; B: the second, which reuses that check), and splits mt's time to its first step into
phases from the run directory's own timestamps: the CLI (validation, run directory), the
supervisor (start, system sampler), torchrun and the worker up to `run_start` (imports, process
group, model, data), and the first step itself. Prints medians; wall-clock seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mt.contract.jsonl import read_events, read_json

PRESET = """[run]
name = "startup"
runs_dir = "{runs}"
[launch]
nproc_per_node = 1
device = "cpu"
[model]
kind = "python"
factory = "examples.charlstm.model:build"
seq_len = 64
[model.args]
vocab = 16
hidden = 128
layers = 2
dropout = 0.1
[data]
source = "python"
factory = "examples.charlstm.data:build"
[data.args]
n = 4096
seq_len = 64
val_n = 0
[train]
micro_batch_size = 32
max_steps = 2
warmup_steps = 0
"""

PLAIN = """
import time, torch
from examples.charlstm.model import build
from examples.charlstm.data import build as data
torch.manual_seed(0)
model = build(vocab=16, hidden=128, layers=2, dropout=0.1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(data("train", n=4096, seq_len=64, val_n=0), batch_size=32, shuffle=True)
x, y = next(iter(loader))
loss = model(x, y)
loss.backward()
opt.step()
print(float(loss), flush=True)
print(time.time())
"""


def plain(tmp: Path) -> float:
    script = tmp / "train.py"
    script.write_text(PLAIN)
    t0 = time.time()
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return float(out.stdout.split()[-1]) - t0


def launched(tmp: Path, i: int) -> dict[str, float]:
    """One `mt launch --headless` into runs<i>: the first into a folder checks the factories, a
    second one finds that check in `.checks/` (tui/supervise/usercheck.py)."""
    runs = tmp / f"runs{i}"
    preset = tmp / "p.toml"
    preset.write_text(PRESET.format(runs=runs))
    before = set(runs.iterdir()) if runs.exists() else set()
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(preset), "--headless"], cwd=REPO, capture_output=True,
                   text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    run = next(p for p in runs.iterdir() if p not in before and not p.name.startswith("."))
    status = read_json(run / "status.json")
    events = read_events(run / "events.jsonl")
    run_start = next(e["t"] for e in events if e["kind"] == "run_start")
    first = next(e["t"] for e in events if e["kind"] == "step")
    spawned = status["attempts"][0]["started"]
    return {"cli": status["started"] - t0, "supervisor": spawned - status["started"],
            "torchrun + worker to run_start": run_start - spawned, "first step": first - run_start, "total": first - t0}


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    plains, mts, colds = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeat):
            plains.append(plain(Path(tmp)))
            colds.append(launched(Path(tmp), i))   # A: a new runs folder, the factory check runs
            mts.append(launched(Path(tmp), i))     # B: the same preset again, its check remembered
            print(f"round {i + 1}: plain {plains[-1]:.2f} s, mt first launch {colds[-1]['total']:.2f} s "
                  f"(CLI {colds[-1]['cli']:.2f}), again {mts[-1]['total']:.2f} s (CLI {mts[-1]['cli']:.2f})", flush=True)
    py = sys.executable
    imports = statistics.median(timed([py, "-P", "-c", "import torch"]) for _ in range(a.repeat))
    bare = statistics.median(timed([py, "-P", "-c", "pass"]) for _ in range(a.repeat))
    trun = statistics.median(timed([py, "-P", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                                    "--no-python", py, "-P", "-c", "pass"]) for _ in range(a.repeat))
    print(f"\nplain script to its first step: {statistics.median(plains):.2f} s (median of {a.repeat})")
    for what, runs in (("first launch of the preset (factory check runs)", colds), ("the same preset again (check remembered)", mts)):
        print(f"mt launch --headless to its first step, {what}: {statistics.median(m['total'] for m in runs):.2f} s, of which:")
        for phase in ("cli", "supervisor", "torchrun + worker to run_start", "first step"):
            print(f"  {phase:32s} {statistics.median(m[phase] for m in runs):.2f} s")
    print(f"for scale: python -P -c pass {bare:.2f} s, import torch {imports:.2f} s, torchrun around a no-op {trun:.2f} s")
    print(json.dumps({"plain_s": statistics.median(plains), "mt_first_s": statistics.median(m["total"] for m in colds),
                      "mt_s": statistics.median(m["total"] for m in mts)}))


if __name__ == "__main__":
    main()
