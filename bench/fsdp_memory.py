"""Memory per rank under DDP and FSDP2, and what activation checkpointing saves, side by side.

    .venv/bin/python bench/fsdp_memory.py [--nproc 4] [--layers 16] [--width 512] [--ac-seq 1024]

1. Model state per rank: mt's GPT (~50M parameters at the defaults), 4 ranks on CPU (gloo), the
   engine's own wrapping (`engine/parallel.py`) and optimizer. Each rank reads its RSS (from
   /proc, after glibc's malloc_trim) after the process group is up, then after two optimizer steps
   with the gradients kept (zero_grad(set_to_none=False)): the difference is its parameters +
   gradients + AdamW state as the allocator holds them (tiny batches: activations are freed by
   then), and whatever the wrapper keeps (DDP's gradient buckets). DDP, then FSDP.
2. Activation checkpointing: one rank, long sequences; the rise of the peak RSS over one training
   step with and without recompute (the high-water mark reset before each step, VmHWM; the steps
   after the first, which allocates gradients and AdamW state), and the step time (median of 3 steps).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident bytes once the C allocator has handed its free pages back (glibc's malloc_trim):
    what the process holds, not the high-water mark of its temporaries."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS as it is
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def reset_peak() -> int:
    """Start a fresh high-water mark (Linux: clear_refs 5 resets VmHWM) at what the process holds now."""
    now = rss()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not allowed here: the lifetime peak, which only overstates later steps' rises
        pass
    return now


def peak() -> int:
    """The resident high-water mark since the last reset_peak (VmHWM), else the lifetime one."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from engine.dist import DistEnv
    from engine.model import GPT
    from engine.optim import build_optimizer
    from engine.parallel import build, wrap
    from mt.contract.preset import config_from_dict

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    env = DistEnv(rank, rank, world, torch.device("cpu"), "gloo")
    seq = a.ac_seq if a.mode.startswith("ac") else 32
    cfg = config_from_dict({"run": {"name": "bench"}, "model": {"vocab_size": 512, "n_layer": a.layers, "n_head": 8,
                                                                 "d_model": a.width, "seq_len": seq},
                            "train": {"strategy": "fsdp" if a.mode == "fsdp" else "ddp",
                                      "activation_checkpointing": a.mode == "ac-on"}}, "bench")
    # the code both wrappers load (DTensor, FSDP2, DCP's state-dict API) is loaded before the
    # baseline: what is measured is the state the model needs, not the size of torch's modules
    import torch.distributed.checkpoint.state_dict
    from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    dist.barrier()
    base = rss()
    torch.manual_seed(0)
    model = build(lambda: GPT(cfg.model), cfg, env)  # the engine's way: under fsdp, meta on ranks but 0
    par = wrap(model, cfg, env)
    opt = build_optimizer(model, cfg.train, env.device)
    batch = 1 if not a.mode.startswith("ac") else 4
    times, rises = [], []
    for step in range(3 if a.mode.startswith("ac") else 2):
        x = torch.randint(512, (batch, seq), generator=torch.Generator().manual_seed(step + rank))
        before, t0 = reset_peak(), time.perf_counter()
        par.module(x, x).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # keep the gradients: they are part of the state measured
        times.append(time.perf_counter() - t0)
        rises.append(peak() - before)
    n_params = sum(p.numel() for p in model.parameters())
    out = {"rank": rank, "state_bytes": rss() - base, "params": int(n_params),
           "step_s": statistics.median(times), "peak_rise_first": rises[0],
           # a step once gradients and AdamW state exist (the first allocates them): its activations
           "peak_rise_bytes": statistics.median(rises[1:]) if len(rises) > 1 else rises[0]}
    rows: list = [None] * world
    dist.all_gather_object(rows, out)
    if rank == 0:
        Path(a.out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def launch(mode: str, nproc: int, a: argparse.Namespace, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", __file__,
           "--worker", "--mode", mode, "--out", str(out), "--layers", str(a.layers), "--width", str(a.width),
           "--ac-seq", str(a.ac_seq)]
    res = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"{mode} failed:\n{res.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--ac-seq", type=int, default=1024)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--mode", default="ddp")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        ddp = launch("ddp", a.nproc, a, Path(d) / "ddp.json")
        fsdp = launch("fsdp", a.nproc, a, Path(d) / "fsdp.json")
        # activations dominate: many blocks, long sequences, a narrower model
        ac_layers = argparse.Namespace(**{**vars(a), "width": max(64, a.width // 2)})
        off = launch("ac-off", 1, ac_layers, Path(d) / "off.json")[0]
        on = launch("ac-on", 1, ac_layers, Path(d) / "on.json")[0]
    mb = 1 << 20
    dd = statistics.median(r["state_bytes"] for r in ddp)
    ff = statistics.median(r["state_bytes"] for r in fsdp)
    print(f"model {ddp[0]['params'] / 1e6:.1f}M parameters, {a.nproc} ranks (gloo, CPU); median over ranks")
    print(f"params+grads+AdamW per rank: ddp {dd / mb:,.0f} MiB (16N = {16 * ddp[0]['params'] / mb:,.0f}), "
          f"fsdp {ff / mb:,.0f} MiB (16N/{a.nproc} = {16 * ddp[0]['params'] / a.nproc / mb:,.0f}): ratio {ff / dd:.3f} "
          f"(goal <= 0.30, ideal {1 / a.nproc:.2f})")
    print(f"activation checkpointing ({ac_layers.layers} layers x {ac_layers.width}, batch 4 x {a.ac_seq} tokens, 1 rank): "
          f"peak rise over a step {off['peak_rise_bytes'] / mb:,.0f} -> {on['peak_rise_bytes'] / mb:,.0f} MiB "
          f"(first step, with the optimizer's state: {off['peak_rise_first'] / mb:,.0f} -> {on['peak_rise_first'] / mb:,.0f}) "
          f"({1 - on['peak_rise_bytes'] / off['peak_rise_bytes']:.0%} less; goal >= 40%), step time "
          f"{off['step_s']:.2f} -> {on['step_s']:.2f} s ({on['step_s'] / off['step_s']:.2f}x)")


if __name__ == "__main__":
    main()
