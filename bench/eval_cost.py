"""The cost of an eval with [eval] samples and a user eval against an eval with validation loss only,
on the tiny preset (presets/tiny-cpu.toml: its model, data and eval_batches), one process.

    .venv/bin/python bench/eval_cost.py [--pairs 20] [--prompts 4] [--new-tokens 32] [--threads 2]

Both sides are the engine's own Evaluator (engine/evaluate.py) over one model and one validation
split: A with no [eval] table, B with `prompts` (each continued by `new-tokens` tokens at temperature
1) and `factory = "eval_cost:next_token_accuracy"` (below: two batches of 8 windows). Evals alternate
A/B in a random order per pair, so the machine's load falls on both alike. Reports each side's median,
B's parts (samples, factory) and B / A with a bootstrap 95% interval of the ratio of means.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

import torch


def next_token_accuracy(model: Any, step: int) -> dict[str, float]:
    """The user eval B runs: the last-token accuracy over two fixed batches of 8 random windows."""
    g = torch.Generator().manual_seed(1234)
    vocab, seq = model.cfg.vocab_size, model.cfg.seq_len
    hits = 0
    for _ in range(2):
        x = torch.randint(0, vocab, (8, seq + 1), generator=g)
        hits += int((model(x[:, :-1]).argmax(-1) == x[:, -1]).sum())
    return {"next_token_accuracy": hits / 16}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from engine import dist as mtdist
    from engine import parallel
    from engine.data import build_splits
    from engine.evaluate import Evaluator
    from engine.kinds import kind_of
    from engine.precision import Precision
    from mt.contract.config import EvalConfig
    from mt.contract.eventlog import NullEventWriter
    from mt.contract.preset import load_preset

    base = load_preset(BENCH.parent / "presets" / "tiny-cpu.toml")
    base = dataclasses.replace(base, launch=dataclasses.replace(base.launch, nproc_per_node=1),
                               run=dataclasses.replace(base.run, workdir=str(BENCH)))
    prompts = ["The quick brown fox", "Once upon a time", "def main():", "In the beginning"][: a.prompts]
    with_eval = dataclasses.replace(base, eval=EvalConfig(prompts=prompts, max_new_tokens=a.new_tokens, temperature=1.0,
                                                          factory="eval_cost:next_token_accuracy"))
    env = mtdist.init(base)
    splits = build_splits(base)
    mtdist.seed_everything(base.run.seed)
    model = kind_of(base).build(base)
    wrapped = parallel.wrap(model, base, env)
    precision = Precision(base, env, wrapped)
    sides = {name: Evaluator(cfg, env, splits, wrapped, model, precision, "the GPT", NullEventWriter())
             for name, cfg in (("A", base), ("B", with_eval))}
    times: dict[str, list[float]] = {"A": [], "B": []}
    parts: dict[str, list[float]] = {"samples": [], "factory": []}
    rng = random.Random(0)
    for i in range(a.warmup + a.pairs):
        order = ["A", "B"]
        rng.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            fields, samples = sides[name].run(100 + i)
            took = time.perf_counter() - t0
            if i >= a.warmup:
                times[name].append(took)
            if name == "B":
                assert len(samples) == len(prompts) and "next_token_accuracy" in fields["metrics"], (fields, samples)
        if i >= a.warmup:  # B's parts on their own, outside the pairs' clock
            extras = sides["B"].extras
            with torch.no_grad():
                t0 = time.perf_counter()
                extras.samples(100 + i)
                t1 = time.perf_counter()
                extras.metrics(100 + i)
                parts["samples"].append(t1 - t0)
                parts["factory"].append(time.perf_counter() - t1)
    n = a.pairs
    ratios = []
    for _ in range(2000):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(sum(times["B"][j] for j in idx) / sum(times["A"][j] for j in idx))
    ratios.sort()
    point = sum(times["B"]) / sum(times["A"])
    ms = {k: statistics.median(v) * 1e3 for k, v in {**times, **parts}.items()}
    print(f"tiny preset ({sum(p.numel() for p in model.parameters()):,} params), eval_batches {base.train.eval_batches} x "
          f"micro_batch {base.train.micro_batch_size} x {base.model.seq_len} tokens, {a.threads} threads, {n} pairs")
    print(f"A val loss only: median {ms['A']:.1f} ms")
    print(f"B + {len(prompts)} prompts x {a.new_tokens} new tokens + factory: median {ms['B']:.1f} ms "
          f"(samples {ms['samples']:.1f} ms, factory {ms['factory']:.1f} ms)")
    print(f"B / A: {point:.2f} (95% interval {ratios[50]:.2f}-{ratios[1949]:.2f})")
    mtdist.shutdown(True)


if __name__ == "__main__":
    main()
