"""A DDP script reporting its data time to mt (`run.step(data_s=...)`); rank --slow-rank's batches take
--delay seconds more (a slow input pipeline on one rank: the others wait for it in the all-reduce)."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import mt

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3000)
p.add_argument("--delay", type=float, default=0.05)
p.add_argument("--slow-rank", type=int, default=1)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
run = mt.init(config=vars(args), max_steps=args.steps)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, args.steps + 1):
    t0 = time.perf_counter()
    if rank == args.slow_rank:
        time.sleep(args.delay)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    data_s = time.perf_counter() - t0
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    ctl = run.step(step, loss=loss.item(), data_s=data_s)
    if ctl.stop:
        break
run.finish()
dist.destroy_process_group()
os._exit(0)
