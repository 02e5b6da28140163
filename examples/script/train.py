"""A plain PyTorch DDP loop that reports to mt: `mt launch examples/script/train.py --nproc 2`.

It also runs as `python train.py` or `torchrun --nproc-per-node 2 train.py`: mt.init then makes
./runs/train-<stamp> itself, and `mt watch` / `mt ckpt` work on it. The model is a tiny
next-token predictor on synthetic text; the checkpoint format is the script's own.
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import mt

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--lr", type=float, default=1e-2)
p.add_argument("--save-every", type=int, default=100)
p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to watch it at leisure")
args = p.parse_args()

ddp = int(os.environ.get("WORLD_SIZE", 1)) > 1
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
if ddp:
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
rank = dist.get_rank() if ddp else 0
run = mt.init(config=vars(args), max_steps=args.steps)  # every rank, after init_process_group

V = 256
torch.manual_seed(0)  # the same weights and the same "language" on every rank
model = torch.nn.Sequential(torch.nn.Embedding(V, 64), torch.nn.Linear(64, V)).to(device)
rule = torch.randperm(V)  # the next token is rule[token] nine times in ten
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
start, skip, lr_scale = 0, 0, 1.0  # skip: batches a rollback skipped (the data position is step + skip)
if run.resume_from:  # the newest checkpoint this run reported, in our own format (after mt rollback: an earlier one)
    state = torch.load(run.resume_from, map_location=device)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start, skip, lr_scale = state["step"], state.get("skip", 0), state.get("lr_scale", 1.0)
skip += run.skip_batches  # mt rollback --skip-batches N: the next N batches of the order are skipped
lr_scale = run.lr_scale if run.lr_scale is not None else lr_scale  # mt rollback --lr-scale X, kept in our checkpoints
net = DDP(model) if ddp else model


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 1000 + rank)  # a function of the step: resume is exact
    x = torch.randint(V, (args.batch, args.seq), generator=g)
    noise = torch.rand(x.shape, generator=g) < 0.1
    y = torch.where(noise, torch.randint(V, x.shape, generator=g), rule[x])
    return x.to(device), y.to(device)


def save(step: int) -> None:
    if rank == 0:
        path = run.dir / "ckpt" / f"step{step}.pt"   # in the run directory (docs/library.md, "Where to save")
        path.parent.mkdir(exist_ok=True)
        part = path.with_name(f".{path.name}.part")   # renamed whole: a kill mid-save leaves the previous one
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "skip": skip, "lr_scale": lr_scale}, part)
        os.replace(part, path)
        run.checkpoint_saved(path, step)  # answers `mt ckpt`; a resumed attempt gets it as run.resume_from
    if ddp:
        dist.barrier()


for step in range(start + 1, args.steps + 1):
    lr = lr_scale * args.lr * min(1.0, step / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
    for group in opt.param_groups:
        group["lr"] = lr
    t0 = time.perf_counter()
    x, y = batch(step + skip)
    data_s = time.perf_counter() - t0  # the step's wait for its batch: mt names a rank slow on its input
    loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    ctl = run.step(step, loss=loss.item(), lr=lr, grad_norm=grad_norm.item(), tokens=x.numel(), data_s=data_s)
    if ctl.checkpoint or ctl.stop or step % args.save_every == 0 or step == args.steps:
        save(step)
    if ctl.stop:  # mt stop, the s key, or SIGTERM (preemption)
        break
    time.sleep(args.sleep)
run.finish()
if ddp:
    dist.destroy_process_group()
