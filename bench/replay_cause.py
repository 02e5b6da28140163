"""`mt replay`: the report's time against the run's own from that checkpoint to the incident, and the
planted-fault suite's hit rate.

Usage: python bench/replay_cause.py [--stretch N] [--suite] [--hooks ROUNDS]. Launches a 1-rank CPU GPT run whose layer
`blocks.2.mlp` goes NaN N steps after a checkpoint, then `mt replay RUN`; prints the run's seconds from
the checkpoint event to the incident, the replay's wall seconds (start-up included) and its loop's,
and their ratios. --suite: the faults tests/cli/test_replay.py plants (a module's output NaN or inf, a
gradient, the loss, a poisoned sample, a spike, on 1 and 2 ranks), each launched and replayed: how
many reports name the planted module. --hooks: the hooks' cost alone, a step of the same model with
and without them in one process, alternately (what the ratio tends to as the stretch grows).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cli.conftest import mt, write_preset
from tests.cli.test_replay import CASES, GPT, ONE, POISONED, _python_model

MODEL = {"vocab_size": 256, "n_layer": 4, "n_head": 4, "d_model": 128, "seq_len": 128}


def launch_and_replay(root: Path, sections: dict[str, Any], *replay_args: str) -> tuple[Path, dict[str, Any], float]:
    """(run, report, wall seconds of `mt replay`)."""
    runs = root / "runs"
    preset = write_preset(root / "p.toml", runs, **sections)
    res = mt("launch", preset, "--headless", timeout=1200)
    if res.returncode != 0:
        raise SystemExit(res.stdout + res.stderr)
    (run,) = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")]
    t0 = time.perf_counter()
    res = mt("replay", run, *replay_args, timeout=1200)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(res.stdout + res.stderr)
    (folder,) = (run / "replay").iterdir()
    return run, json.loads((folder / "report.json").read_text()), seconds


def timing(stretch: int) -> None:
    sections = {
        "launch": {"nproc_per_node": 1},
        "model": MODEL,
        "train": {"micro_batch_size": 8, "max_steps": 2 * stretch + 2, "log_every": 1},
        "checkpoint": {"every_steps": stretch},   # at `stretch`, then at the NaN's step (not before it)
        "faults": {"module": "blocks.2.mlp", "module_at_step": 2 * stretch, "module_fault": "nan"},
    }
    with tempfile.TemporaryDirectory() as tmp:
        _, report, wall = launch_and_replay(Path(tmp), sections)
    original = report["original_s"]
    print(f"stretch {report['step'] - report['from_step']} steps (checkpoint {report['from_step']} -> NaN at {report['step']}), "
          f"named {report['module']} ({report['phase']}), reproduced {report['reproduced']}")
    print(f"run, checkpoint to incident: {original:.2f} s")
    print(f"mt replay, wall: {wall:.2f} s  (ratio {wall / original:.2f})")
    print(f"replay's loop (hooks on every module): {report['steps_s']:.2f} s  (ratio {report['steps_s'] / original:.2f})")


def hooks(rounds: int) -> None:
    """The hooks' cost in one process: the timing bench's model, a step with and without them, alternately."""
    import statistics

    import torch

    from engine.kinds import kind_of
    from engine.replay import Recorder
    from mt.contract.preset import config_from_dict

    cfg = config_from_dict({"run": {"name": "hooks"}, "model": MODEL}, "bench")
    torch.manual_seed(0)
    plain, hooked = kind_of(cfg).build(cfg), kind_of(cfg).build(cfg)
    recorder = Recorder(0)
    recorder.install(hooked)
    x, y = torch.randint(0, 256, (8, 128)), torch.randint(0, 256, (8, 128))

    def step(model: Any, rec: Recorder | None) -> float:
        t0 = time.perf_counter()
        if rec:
            rec.begin(1)
            rec.micro = 0
        loss = model(x, y)
        if rec:
            rec.loss(loss)
        loss.backward()
        if rec:
            rec.active = False
            rec.flush()
        return time.perf_counter() - t0

    a, b = [], []
    for _ in range(rounds):
        a.append(step(plain, None))
        b.append(step(hooked, recorder))
    print(f"step without hooks {statistics.median(a) * 1e3:.1f} ms, with {statistics.median(b) * 1e3:.1f} ms: "
          f"ratio {statistics.median(b) / statistics.median(a):.3f} (median of {rounds}, alternating, "
          f"{torch.get_num_threads()} threads)")


def suite() -> None:
    cases: dict[str, tuple[dict[str, Any], tuple[str, ...], str]] = {
        name: (sections, (), module) for name, (sections, module, _) in CASES.items()}
    cases["poisoned-sample"] = (POISONED, (), "energy")
    cases["spike"] = ({**GPT, **ONE, "faults": {"module": "blocks.1.attn", "module_at_step": 12, "module_fault": "spike"}},
                      ("--step", "12"), "blocks.1.attn")
    hits = 0
    for name, (sections, args, module) in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            if name == "poisoned-sample":
                sections = {**sections, **_python_model(Path(tmp))}
            _, report, wall = launch_and_replay(Path(tmp), sections, *args)
        hit = report.get("module") == module
        hits += hit
        print(f"{name:<24} planted {module:<16} named {report.get('module')!s:<16} {report.get('kind')}  "
              f"reproduced {report.get('reproduced')}  {wall:.1f} s  {'hit' if hit else 'MISS'}")
    print(f"hit rate: {hits}/{len(cases)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stretch", type=int, default=60, help="steps from the checkpoint to the NaN")
    parser.add_argument("--suite", action="store_true")
    parser.add_argument("--hooks", type=int, default=0, metavar="ROUNDS", help="only the hooks' cost in one process")
    args = parser.parse_args()
    if args.hooks:
        hooks(args.hooks)
    elif args.suite:
        suite()
    else:
        timing(args.stretch)


if __name__ == "__main__":
    main()
