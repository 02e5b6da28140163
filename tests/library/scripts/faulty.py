"""A minimal DDP loop for the script tests, with faults chosen by flags; --no-mt: no mt calls at all."""
import argparse
import datetime
import json
import os
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
p.add_argument("--run-dir", help="ignored: names a run directory in the command line, as mt's own workers do")
p.add_argument("--save-at", type=int, default=0, help="rank 0 reports a checkpoint (a JSON file) at this step")
args = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
assert engine.MARK == "the user's own engine.py"
run = None
if not args.no_mt:
    import mt
    run = mt.init(config=vars(args))
start = json.loads(run.resume_from.read_text())["step"] if run is not None and run.resume_from else 0
first_attempt = os.environ.get("MT_ATTEMPT", "1") == "1"  # a fault strikes the first attempt only
for step in range(start + 1, args.steps + 1):
    if step == args.at and rank == args.rank and first_attempt:
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
        if step == args.save_at and rank == 0:
            path = run.dir / f"ckpt-{step}.json"
            path.write_text(json.dumps({"step": step}))
            run.checkpoint_saved(path, step)
    time.sleep(args.sleep)
if run is not None:
    run.finish()
dist.destroy_process_group()
