"""The engine on a real GPU, in one short script (for a session that is lent one; see README).

    python3 bench/gpu_check.py [--out DIR] [--gpt2-steps 200] [--fsdp-steps 60] [--dry]

1. the tiny GPT on CUDA through torchrun (NCCL), bf16 and fp16 (with a forced overflow);
2. checkpoint + SIGKILL + resume on CUDA: later losses compared with an uninterrupted run;
3. MFU of gpt2-small (124M, seq 1024, bf16) on one GPU for a few hundred steps;
4. gpt2-small under fsdp, eager then `train.compile = true` (MFU of each, the ratio, the first
   step's compile time, recompiles), both checkpointing every 20 steps with `[checkpoint] async =
   true` where this mt accepts the key (else a printed note, and blocking checkpoints).
Needs only torch, numpy and psutil (no TUI packages). `--dry`: the same code on CPU with tiny
models and a few steps (checks the script itself on a machine without a GPU; numbers mean nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from mt.config import ConfigError
from mt.jsonl import read_events
from mt.preset import config_from_dict

TINY = {
    "run": {"name": "gpu-tiny", "seed": 3},
    "launch": {"device": "cuda", "nproc_per_node": 1},
    "model": {"vocab_size": 256, "n_layer": 4, "n_head": 4, "d_model": 128, "seq_len": 128, "dropout": 0.1},
    "data": {"source": "synthetic", "num_workers": 2, "val_fraction": 0.05},
    "train": {"micro_batch_size": 16, "grad_accum_steps": 2, "max_steps": 60, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5, "eval_every": 30},
    "checkpoint": {"every_steps": 10},
}
GPT2 = {
    "run": {"name": "gpu-gpt2", "seed": 3},
    "launch": {"device": "cuda", "nproc_per_node": 1},
    "model": {"vocab_size": 50304, "n_layer": 12, "n_head": 12, "d_model": 768, "seq_len": 1024},
    "data": {"source": "synthetic", "synthetic_samples": 8192, "num_workers": 4, "val_fraction": 0.0},
    "train": {"micro_batch_size": 16, "grad_accum_steps": 4, "lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 20, "precision": "bf16", "log_every": 1},
}


def merged(raw: dict, **over: dict) -> dict:
    raw = json.loads(json.dumps(raw))
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return raw


def dry(raw: dict) -> dict:
    """The CPU stand-in of a preset for --dry: a tiny model, few samples, fp32 where CPU autocast is slow."""
    return merged(raw, launch={"device": "cpu"}, data={"num_workers": 0, "synthetic_samples": 512},
                  model={"vocab_size": 64, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32},
                  train={"micro_batch_size": 4, "grad_accum_steps": 1})


def make(root: Path, name: str, raw: dict, **over: dict) -> Path:
    raw = merged(raw, **over)
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config_from_dict(raw, name).to_dict()))
    return run


def start(run: Path, attempt: int = 1) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "engine", "--run-dir", str(run), "--attempt", str(attempt)]
    return subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), start_new_session=True,
                            stdout=open(run / "torchrun.log", "ab"), stderr=subprocess.STDOUT)


def steps(run: Path, attempt: int | None = None) -> list[dict]:
    out, cur = [], 0
    for e in read_events(run / "events.jsonl"):
        cur = e["attempt"] if e["kind"] == "run_start" else cur
        if e["kind"] == "step" and (attempt is None or cur == attempt):
            out.append(e)
    return out


def async_checkpoints() -> dict:
    """{"async": True} where this mt takes `[checkpoint] async = true`, else {} and a note."""
    try:
        config_from_dict(merged(GPT2, checkpoint={"async": True}), "gpu_check")
    except ConfigError as e:
        print(f"note: async checkpoints skipped, [checkpoint] async is not accepted here ({e})", flush=True)
        return {}
    return {"async": True}


def fsdp_compile(root: Path, steps_n: int, gpt2: dict) -> dict:
    """gpt2-small under fsdp, eager then compiled: MFU side by side, and what checkpoints cost the loop."""
    ckpt = {"every_steps": 20, **async_checkpoints()}
    out: dict = {"async_checkpoint": bool(ckpt.get("async"))}
    for name, compiled in (("fsdp_eager", False), ("fsdp_compile", True)):
        run = make(root, name, gpt2, train={"max_steps": steps_n, "strategy": "fsdp", "compile": compiled}, checkpoint=ckpt)
        rc = start(run).wait(timeout=300)
        s = steps(run)
        later = s[10:]
        cks = [e for e in read_events(run / "events.jsonl") if e["kind"] == "checkpoint"]
        out[name] = {"rc": rc, "steps": len(s), "first_step_s": s[0]["step_time_s"] if s else None,
                     "median_tok_s": statistics.median(e["tokens_per_s"] for e in later) if later else None,
                     "median_mfu": statistics.median(e.get("mfu") or 0 for e in later) if later else None,
                     "recompiles": sum(e.get("recompiles") or 0 for e in s),
                     "checkpoints": [{"step": e["step"], "seconds": e.get("seconds"), "blocking_s": e.get("blocking_s")} for e in cks]}
        print(name, out[name], flush=True)
    eager, comp = out["fsdp_eager"], out["fsdp_compile"]
    if eager["median_tok_s"] and comp["median_tok_s"]:
        out["compile_speedup"] = comp["median_tok_s"] / eager["median_tok_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--gpt2-steps", type=int, default=200)
    ap.add_argument("--fsdp-steps", type=int, default=60)
    ap.add_argument("--dry", action="store_true", help="the same code on CPU, tiny models, a few steps")
    a = ap.parse_args()
    tiny, gpt2 = (dry(TINY), dry(GPT2)) if a.dry else (TINY, GPT2)
    if a.dry:
        tiny["train"]["max_steps"] = 30
        gpt2["train"]["precision"] = "fp32"  # bf16 autocast on CPU is slow and says nothing here
        a.gpt2_steps, a.fsdp_steps = min(a.gpt2_steps, 25), min(a.fsdp_steps, 25)
    report: dict = {"dry": a.dry}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for precision, faults in [("bf16", {}), ("fp16", {"overflow_at_step": 20})]:
            run = make(root, precision, tiny, train={"precision": precision}, faults=faults)
            rc = start(run).wait(timeout=600)
            s = steps(run)
            report[precision] = {"rc": rc, "first_loss": s[0]["loss"] if s else None, "last_loss": s[-1]["loss"] if s else None,
                                 "skipped_steps": [e["step"] for e in s if e["skipped"]],
                                 "median_tok_s": statistics.median(e["tokens_per_s"] for e in s[5:]) if len(s) > 5 else None}
            print(precision, report[precision], flush=True)

        ref = make(root, "ref", tiny)
        start(ref).wait(timeout=600)
        run = make(root, "killed", tiny)
        proc = start(run)
        while not any(e["step"] >= 25 for e in steps(run)):
            time.sleep(0.2)
        parent = psutil.Process(proc.pid)
        for p in [parent] + parent.children(recursive=True):
            p.send_signal(signal.SIGKILL)
        proc.wait()
        start(run, attempt=2).wait(timeout=600)
        refs = {e["step"]: e["loss"] for e in steps(ref)}
        after = steps(run, 2)
        diffs = [abs(e["loss"] - refs[e["step"]]) for e in after]
        report["resume"] = {"resumed_at": after[0]["step"] - 1 if after else None, "steps_compared": len(diffs),
                            "bitwise_equal": all(d == 0 for d in diffs), "max_abs_loss_diff": max(diffs) if diffs else None}
        print("resume", report["resume"], flush=True)

        run = make(root, "gpt2", gpt2, train={"max_steps": a.gpt2_steps})
        rc = start(run).wait(timeout=540)
        s = steps(run)[20:]
        report["gpt2_small"] = {"rc": rc, "steps": len(s) + 20, "median_tok_s": statistics.median(e["tokens_per_s"] for e in s) if s else None,
                                "median_mfu": statistics.median(e.get("mfu") or 0 for e in s) if s else None,
                                "peak_mem_gib": max(e["mem_peak_bytes"] for e in s) / 2**30 if s else None}
        print("gpt2_small", report["gpt2_small"], flush=True)

        report["gpt2_fsdp"] = fsdp_compile(root, a.fsdp_steps, gpt2)
    Path(a.out, "gpu_check.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
