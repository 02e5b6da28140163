"""mt's GPT with and without biases (`[model] bias`), side by side on the same shape, one process.

    .venv/bin/python bench/gpt_bias.py [--pairs 60] [--threads 2] [--d-model 256 --n-layer 4 --seq-len 256]

Two models of one shape (same seed, so the same weights where both have them), each with its own
AdamW; training steps (forward, backward, optimizer step) alternate between them one by one, in a
random order per pair, so the machine's load falls on both alike. Reports the median step time of
each, their ratio with a bootstrap 95% interval of the ratio of means, and the parameter counts.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch

from engine.model import GPT, count_params
from engine.optim import build_optimizer
from mt.contract.config import ModelConfig, TrainConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=512)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    shape = dict(vocab_size=a.vocab, n_layer=a.n_layer, n_head=a.n_head, d_model=a.d_model, seq_len=a.seq_len)
    arms = {}
    for bias in (True, False):
        torch.manual_seed(0)
        model = GPT(ModelConfig(**shape, bias=bias))
        arms[bias] = (model, build_optimizer(model, TrainConfig(), torch.device("cpu")))
    x = torch.randint(0, a.vocab, (a.batch, a.seq_len))
    times: dict[bool, list[float]] = {True: [], False: []}
    rng = random.Random(0)

    def step(bias: bool) -> float:
        model, opt = arms[bias]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x, x).backward()
        opt.step()
        return time.perf_counter() - t0

    for i in range(a.warmup + a.pairs):
        order = [True, False]
        rng.shuffle(order)
        for bias in order:
            t = step(bias)
            if i >= a.warmup:
                times[bias].append(t)
    ratios = []
    for _ in range(2000):
        idx = [rng.randrange(a.pairs) for _ in range(a.pairs)]
        ratios.append(sum(times[False][j] for j in idx) / sum(times[True][j] for j in idx))
    ratios.sort()
    point = sum(times[False]) / sum(times[True])
    print(f"shape {shape}, batch {a.batch}, {a.threads} threads, {a.pairs} pairs")
    print(f"params: bias {count_params(arms[True][0])[0]:,}, no bias {count_params(arms[False][0])[0]:,}")
    print(f"median step: bias {statistics.median(times[True]) * 1e3:.1f} ms, "
          f"no bias {statistics.median(times[False]) * 1e3:.1f} ms")
    print(f"no bias / bias step time: {point:.4f} (95% interval {ratios[50]:.4f}-{ratios[1949]:.4f})")


if __name__ == "__main__":
    main()
