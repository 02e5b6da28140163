"""Two ranks where rank 1 never joins the 4th all_reduce: what PyTorch's flight recorder keeps of it.

    python -m torch.distributed.run --nproc-per-node 2 bench/flight_job.py BACKEND OUT [--dump]

BACKEND gloo (CPU) or nccl (a GPU per rank). With the recorder's variables set (tui/stacks/recorder.py
`recorder_env`), torch itself dumps on an NCCL watchdog timeout; `--dump` also has each rank write
torch's `_dump_fr_trace()` to OUT/rank_<N> (rank 1 at once, rank 0 after its collective failed).
Used by bench/gpu_check.py (the flight part) and tests/diagnose/test_flight.py.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

backend, out = sys.argv[1], sys.argv[2]
timeout_s = float(os.environ.get("FLIGHT_TIMEOUT_S", "6"))
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
rank = dist.get_rank()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if backend == "nccl" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
x = torch.ones(4, device=device)
for _ in range(3):
    dist.all_reduce(x)
if device.type == "cuda":
    torch.cuda.synchronize()


def dump() -> None:
    if "--dump" in sys.argv:
        from torch._C._distributed_c10d import _dump_fr_trace

        with open(os.path.join(out, f"rank_{rank}"), "wb") as f:
            f.write(_dump_fr_trace())


if rank == 1:
    dump()
    time.sleep(timeout_s * 2.5)  # never joins collective #4: the others time out in it
else:
    try:
        dist.all_reduce(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print("rank 0: collective #4 returned", flush=True)
    except Exception as e:  # noqa: BLE001 - gloo: the timeout surfaces here; NCCL's watchdog ends the process instead
        print(f"rank 0: collective #4 failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    dump()
    time.sleep(timeout_s)        # NCCL: time for the watchdog's dump
os._exit(0)
