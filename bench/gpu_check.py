"""The engine on a real GPU, in one short script (for a session that is lent one; see README).

    python3 bench/gpu_check.py [--out DIR] [--gpt2-steps 300]

1. the tiny GPT on CUDA through torchrun (NCCL), bf16 and fp16 (with a forced overflow);
2. checkpoint + SIGKILL + resume on CUDA: later losses compared with an uninterrupted run;
3. MFU of gpt2-small (124M, seq 1024, bf16) on one GPU for a few hundred steps.
Needs only torch, numpy and psutil (no TUI packages).
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


def make(root: Path, name: str, raw: dict, **over: dict) -> Path:
    raw = json.loads(json.dumps(raw))
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--gpt2-steps", type=int, default=300)
    a = ap.parse_args()
    report: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for precision, faults in [("bf16", {}), ("fp16", {"overflow_at_step": 20})]:
            run = make(root, precision, TINY, train={"precision": precision}, faults=faults)
            rc = start(run).wait(timeout=600)
            s = steps(run)
            report[precision] = {"rc": rc, "first_loss": s[0]["loss"] if s else None, "last_loss": s[-1]["loss"] if s else None,
                                 "skipped_steps": [e["step"] for e in s if e["skipped"]],
                                 "median_tok_s": statistics.median(e["tokens_per_s"] for e in s[5:]) if len(s) > 5 else None}
            print(precision, report[precision], flush=True)

        ref = make(root, "ref", TINY)
        start(ref).wait(timeout=600)
        run = make(root, "killed", TINY)
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

        run = make(root, "gpt2", GPT2, train={"max_steps": a.gpt2_steps})
        rc = start(run).wait(timeout=540)
        s = steps(run)[20:]
        report["gpt2_small"] = {"rc": rc, "steps": len(s) + 20, "median_tok_s": statistics.median(e["tokens_per_s"] for e in s) if s else None,
                                "median_mfu": statistics.median(e.get("mfu") or 0 for e in s) if s else None,
                                "peak_mem_gib": max(e["mem_peak_bytes"] for e in s) / 2**30 if s else None}
        print("gpt2_small", report["gpt2_small"], flush=True)
    Path(a.out, "gpu_check.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
