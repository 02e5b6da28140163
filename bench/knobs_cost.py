"""What the knob path (`mt set`, engine/knobs.py) costs a step when no knob changes: the real engine,
2 gloo ranks, with it (this tree) and without it (`--base`, the commit before it), alternately.

    .venv/bin/python bench/knobs_cost.py [--rounds 4] [--steps 300] [--nproc 2] [--base 34e78fd] [--calls 2000]

First, in this process, the step's agreement itself, the only place the knob path adds work to a step
that changes nothing (one more float in the row, the flag read back): head's `engine/consensus.py`
`agree(..., knob=tuner.asked)` and base's `agree(...)` on one rank (the same collective on both sides
left out), in alternating blocks of `--calls` calls; CPU µs per call, and the paired blocks' ratios.
Then each round runs the same small preset once per side (`python -m engine`, the side's own tree on
PYTHONPATH), every step logged. A side's step is the median over steps 20.. of the engine's own
`step_time_s` (forward to optimizer, the agreement's row included) and of the wall time between
consecutive step events (everything a step does, the control poll and the knob check included).
Prints both sides' medians and the paired rounds' ratios head / base, with their median.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PRESET = {
    "run": {"name": "bench", "seed": 7},
    "launch": {"nproc_per_node": 2, "device": "cpu", "pg_timeout_s": 120},
    "model": {"vocab_size": 64, "n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 64},
    "data": {"source": "synthetic", "synthetic_samples": 4096, "val_fraction": 0.0},
    "train": {"micro_batch_size": 8, "grad_accum_steps": 1, "max_steps": 300, "lr": 1e-3, "min_lr": 1e-4,
              "warmup_steps": 10, "log_every": 1},
    "checkpoint": {"every_steps": 0},
}


def _one(tree: Path, run: Path, nproc: int) -> tuple[float, float]:
    """(median step_time_s, median wall time between step events) of one engine run."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "engine", "--run-dir", str(run), "--attempt", "1"]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    steps = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    steps = [e for e in steps if e["kind"] == "step"][20:]
    walls = [b["t"] - a["t"] for a, b in zip(steps, steps[1:])]
    return statistics.median(e["step_time_s"] for e in steps), statistics.median(walls)


def agreement(base_tree: Path, calls: int, blocks: int) -> None:
    """Head's and base's agreement per call (µs of this process's CPU), alternating blocks, one rank:
    the row is built, concatenated and read back as on every rank; the collective (the same one
    all_gather of one small row on both sides) is left out, for a loaded machine's gloo drowns µs."""
    import importlib.util
    import time

    import torch

    from engine.consensus import agree
    from engine.dist import DistEnv

    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("base_consensus", base_tree / "engine" / "consensus.py")
    assert spec is not None and spec.loader is not None
    base = importlib.util.module_from_spec(spec)
    sys.modules["base_consensus"] = base  # its dataclasses look their module up there
    spec.loader.exec_module(base)
    env = DistEnv(0, 0, 1, torch.device("cpu"), "gloo")
    loss, norm = torch.tensor(2.5, dtype=torch.float64), torch.tensor(1.0)

    class Tuner:  # engine/knobs.py's: a step asks whether rank 0 holds settings
        pending: list = []

        @property
        def asked(self) -> bool:
            return bool(self.pending)

    tuner = Tuner()
    sides = {"head": lambda: agree(env, loss, False, False, norm, None, tuner.asked).knob,
             "base": lambda: base.agree(env, loss, False, False, norm, None)}
    per: dict[str, list[float]] = {"head": [], "base": []}
    for b in range(blocks):
        for side in ("head", "base") if b % 2 == 0 else ("base", "head"):
            t0 = time.process_time()
            for _ in range(calls):
                sides[side]()
            per[side].append((time.process_time() - t0) / calls)
    ratios = sorted(h / b for h, b in zip(per["head"], per["base"]))
    med = {k: 1e6 * statistics.median(v) for k, v in per.items()}
    print(f"agreement per call (CPU): head {med['head']:.1f} µs, base {med['base']:.1f} µs "
          f"({med['head'] - med['base']:+.1f} µs); head/base over {blocks} blocks: median {statistics.median(ratios):.3f}, "
          f"range {ratios[0]:.3f}-{ratios[-1]:.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--base", default="34e78fd", help="the commit without the knob path")
    ap.add_argument("--calls", type=int, default=2000, help="agreement calls per block")
    ap.add_argument("--blocks", type=int, default=20, help="blocks per side of the agreement")
    args = ap.parse_args()
    from mt.contract.preset import config_from_dict

    preset = {**PRESET, "launch": {**PRESET["launch"], "nproc_per_node": args.nproc},
              "train": {**PRESET["train"], "max_steps": args.steps}}
    config = json.dumps(config_from_dict(preset, "bench").to_dict())
    with tempfile.TemporaryDirectory(prefix="mt-knobs-bench-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.base], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        agreement(base, args.calls, args.blocks)
        results: dict[str, list[tuple[float, float]]] = {"head": [], "base": []}
        for r in range(args.rounds):
            for side, tree in (("head", REPO), ("base", base)) if r % 2 == 0 else (("base", base), ("head", REPO)):
                run = Path(tmp) / f"{side}-{r}"
                run.mkdir()
                (run / "config.json").write_text(config)
                results[side].append(_one(tree, run, args.nproc))
                step, wall = results[side][-1]
                print(f"round {r} {side}: step_time {1e3 * step:.2f} ms, wall {1e3 * wall:.2f} ms", flush=True)
    for i, what in ((0, "step_time_s"), (1, "wall between steps")) if args.rounds else ():
        head = [x[i] for x in results["head"]]
        base_ = [x[i] for x in results["base"]]
        ratios = [h / b for h, b in zip(head, base_)]
        print(f"{what}: head {1e3 * statistics.median(head):.2f} ms, base {1e3 * statistics.median(base_):.2f} ms; "
              f"head/base per round {', '.join(f'{x:.3f}' for x in ratios)}; median {statistics.median(ratios):.3f}")
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
