"""Two ranks (torchrun) fold their wishes with mt.agree.Agreement under a process group whose every CUDA
call would fail: the agreement must use only the host. Each rank writes one JSON line per step to its own
file (ranks_<rank>.jsonl in the working directory): two ranks printing to one pipe interleave their lines."""
import json
import os

import torch
import torch.distributed as dist


def no_device(*_a, **_k):
    raise AssertionError("the agreement touched torch.cuda")


torch.cuda.current_device = torch.cuda.set_device = torch.cuda.synchronize = no_device

from mt.agree import Agreement  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
agree = Agreement(int(os.environ["WORLD_SIZE"]))
out = open(f"ranks_{rank}.jsonl", "w")
for step in range(1, 5):
    ckpt, stop, tokens = agree.decide(checkpoint=rank == 1 and step == 2, stop=rank == 0 and step == 4,
                                      tokens=float(10 * (rank + 1)))
    print(json.dumps({"rank": rank, "step": step, "checkpoint": ckpt, "stop": stop, "tokens": tokens}), file=out, flush=True)
# the flags went through a gloo group of their own, not the script's default group
print(json.dumps({"rank": rank, "own_group": agree._host_group is not None and agree._host_group != dist.group.WORLD}), file=out)
out.close()
dist.destroy_process_group()
