"""A minimal hand-written DDP loop (the nanoGPT way) with the engine's model, data and settings.

Run by bench/engine_vs_baseline.py, under torchrun (DDP) or, for one process, as a plain loop
with no process group and no DDP wrapper; prints one JSON line with tokens/s.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from engine.data import build_splits
from engine.kinds import kind_of
from engine.optim import build_optimizer, lr_at, set_lr
from engine.user import add_workdir, call_model, loss_of
from mt.contract.preset import load_config_json


class Samples(Dataset):
    """The samples alone, as a plain loop has them: no dataset index travels with a batch."""

    def __init__(self, ds: Dataset) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> object:
        return self.ds[i][0]


def main(config_path: str, warmup: int) -> None:
    cfg = load_config_json(config_path)
    add_workdir(cfg)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(cfg.run.seed)
    model = kind_of(cfg).build(cfg)
    ddp = DDP(model) if distributed else model
    opt = build_optimizer(model, cfg.train, torch.device("cpu"))
    splits = build_splits(cfg)
    train = Samples(splits.train)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, seed=cfg.run.seed, drop_last=True)
    loader = DataLoader(train, batch_size=cfg.train.micro_batch_size, sampler=sampler, collate_fn=getattr(splits.collate, "fn", None),
                        num_workers=cfg.data.num_workers, drop_last=True)
    t = cfg.train

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    it = batches()
    times, waits = [], []
    for step in range(1, t.max_steps + 1):
        t0 = time.perf_counter()
        set_lr(opt, lr_at(step, t))
        wait = 0.0
        for micro in range(t.grad_accum_steps):
            w0 = time.perf_counter()
            batch = next(it)
            wait += time.perf_counter() - w0
            with (ddp.no_sync() if distributed and micro < t.grad_accum_steps - 1 else nullcontext()):
                loss = loss_of(call_model(ddp, batch), "model")
                (loss / t.grad_accum_steps).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip or math.inf)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_t = loss.detach().clone()
        if distributed:
            dist.all_reduce(loss_t)  # the one sync a minimal loop also needs to log a global loss
        float(loss_t)                # and reading it back, as any loop that logs its loss does
        times.append(time.perf_counter() - t0)
        waits.append(wait)
    if rank == 0:
        tokens = world * t.micro_batch_size * t.grad_accum_steps * cfg.model.seq_len
        steady = sorted(times[warmup:])
        wait = sorted(waits[warmup:])[len(steady) // 2]
        print(json.dumps({"tokens_per_s": tokens / steady[len(steady) // 2], "median_step_s": steady[len(steady) // 2],
                          "median_data_wait_s": wait}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
