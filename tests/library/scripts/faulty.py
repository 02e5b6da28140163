"""A minimal DDP loop for the script tests, with faults chosen by flags; --no-mt: no mt calls at all."""
import argparse
import datetime
import time

import torch
import torch.distributed as dist

import engine  # this folder's own engine.py, as torchvision's reference scripts have

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--fault", choices=["none", "crash", "hang", "oom"], default="none")
p.add_argument("--at", type=int, default=5)
p.add_argument("--rank", type=int, default=1)
p.add_argument("--no-mt", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
assert engine.MARK == "the user's own engine.py"
run = None
if not args.no_mt:
    import mt
    run = mt.init(config=vars(args))
for step in range(1, args.steps + 1):
    if step == args.at and rank == args.rank:
        if args.fault == "crash":
            raise RuntimeError(f"injected crash on rank {rank} at step {step}")
        if args.fault == "oom":  # what torch.OutOfMemoryError says on a GPU
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.15 GiB total capacity)")
        if args.fault == "hang":
            while True:
                time.sleep(1.0)
    t = torch.ones(1)
    dist.all_reduce(t)  # the step's gradient sync
    if run is not None:
        run.step(step, loss=1.0 / step, lr=1e-3)
    time.sleep(args.sleep)
if run is not None:
    run.finish()
dist.destroy_process_group()
