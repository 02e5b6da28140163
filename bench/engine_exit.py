"""What an engine process spends between its run_end and its exit: frozen GC vs the full teardown.

Usage: python bench/engine_exit.py [--repeat N]. Runs the same tiny 1-rank CPU run alternately as
`python -m engine` (gc.freeze() before exit, engine/__main__.py) and through the same main()
followed by a plain sys.exit (the interpreter's last full collection), and prints, per variant,
the median seconds from run_end to the process's exit and the median CPU seconds of the process,
with their ratios. Every test that starts the engine waits for that exit.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mt.contract.jsonl import read_events
from mt.contract.preset import config_from_dict

CONFIG = {
    "run": {"name": "exit", "seed": 7},
    "launch": {"nproc_per_node": 1, "device": "cpu"},
    "model": {"vocab_size": 64, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32},
    "data": {"source": "synthetic", "synthetic_samples": 512, "val_fraction": 0.0},
    "train": {"micro_batch_size": 4, "max_steps": 4, "warmup_steps": 1},
    "checkpoint": {"every_steps": 0},
}
# the engine's own main() with the exit it had before: sys.exit after main(), nothing frozen
TEARDOWN = "import sys, engine.__main__ as m; sys.exit(m.main(sys.argv[1:]))"
VARIANTS = {"frozen": ["-m", "engine"], "teardown": ["-c", TEARDOWN]}


def one(variant: str, root: Path, n: int) -> tuple[float, float]:
    """(seconds from run_end to exit, CPU seconds of the process) for one run."""
    run = root / f"{variant}-{n}"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config_from_dict(CONFIG, "bench").to_dict()))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *VARIANTS[variant], "--run-dir", str(run)], cwd=REPO, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    exited = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    end = [e for e in read_events(run / "events.jsonl") if e.get("kind") == "run_end"][-1]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return exited - end["t"], cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    got: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.repeat):
            for variant in VARIANTS:  # alternated, so a busy moment of the host hits both
                got[variant].append(one(variant, Path(tmp), n))
    med = {v: (statistics.median(x for x, _ in r), statistics.median(c for _, c in r)) for v, r in got.items()}
    print(f"host: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.repeat} runs per variant (medians)")
    for v, (lag, cpu) in med.items():
        print(f"{v:9s} run_end -> exit {lag:6.2f} s   process CPU {cpu:6.2f} s")
    (fl, fc), (tl, tc) = med["frozen"], med["teardown"]
    print(f"frozen / teardown: exit lag {fl / tl:.2f}x, CPU {fc / tc:.2f}x (CPU saved per engine process: {tc - fc:.2f} s)")


if __name__ == "__main__":
    main()
