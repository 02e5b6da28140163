"""torch.compile on CPU against eager, side by side: the engine on a tiny GPT, one rank.

    .venv/bin/python bench/compile_speed.py [--steps 40] [--threads 1]

Four engine runs of the same preset, one after the other: eager; `train.compile = true` with an
empty inductor cache (TORCHINDUCTOR_CACHE_DIR, the cold first compile); compiled again on the
cache the cold run filled (what a resumed or repeated run pays); eager again. From each run's
step events: the first step's time (the compile happens in it) and the median step time of the
steps after the first five; the report gives compiled / eager (the mean of the two eager runs
around them) as a ratio, and the two eager runs' own ratio, which says how noisy the machine was.
Then, in this process on the warm cache, the same model compiled the engine's way
(`engine/parallel.py` `wrap`) with eager and compiled steps interleaved one by one
(`torch.compiler.set_stance("force_eager")` for the eager ones): the least load-sensitive ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from mt.contract.jsonl import read_events
from mt.contract.preset import config_from_dict

TINY = {
    "run": {"name": "compile-speed", "seed": 1},
    "launch": {"device": "cpu", "nproc_per_node": 1},
    "model": {"vocab_size": 256, "n_layer": 4, "n_head": 4, "d_model": 128, "seq_len": 128},
    "data": {"source": "synthetic", "synthetic_samples": 4096, "val_fraction": 0.0},
    "train": {"micro_batch_size": 8, "max_steps": 40, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 2},
}


def run_engine(root: Path, name: str, compile_: bool, steps: int, threads: int, cache: Path) -> dict:
    raw = json.loads(json.dumps(TINY))
    raw["train"].update(compile=compile_, max_steps=steps)
    run = root / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config_from_dict(raw, name).to_dict()))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(threads), TORCHINDUCTOR_CACHE_DIR=str(cache))
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, "-m", "engine", "--run-dir", str(run)], cwd=REPO, env=env,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - t0
    s = [e for e in read_events(run / "events.jsonl") if e["kind"] == "step"]
    if rc != 0 or len(s) < 7:
        raise SystemExit(f"{name}: engine exit {rc}, {len(s)} steps; see {run}/logs")
    return {"first_step_s": s[0]["step_time_s"], "median_step_s": statistics.median(e["step_time_s"] for e in s[5:]),
            "median_tok_s": statistics.median(e["tokens_per_s"] for e in s[5:]), "wall_s": wall,
            "recompiles": sum(e.get("recompiles") or 0 for e in s), "last_loss": s[-1]["loss"]}


def interleaved(steps: int, threads: int, cache: Path) -> dict:
    """Eager and compiled training steps of one model, alternating, in this process (cache: warm)."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # read when inductor is imported, below
    import torch

    from engine.dist import DistEnv
    from engine.model import GPT
    from engine.parallel import wrap

    torch.set_num_threads(threads)
    cfg = config_from_dict(json.loads(json.dumps({**TINY, "train": {**TINY["train"], "compile": True}})), "bench")
    model = GPT(cfg.model)
    wrap(model, cfg, DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(cfg.model.vocab_size, (TINY["train"]["micro_batch_size"], cfg.model.seq_len))

    def step() -> float:
        t0 = time.perf_counter()
        model(x, x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    step()  # compiles (or loads from the cache)
    first = time.perf_counter() - t0
    eager, compiled = [], []
    for _ in range(steps):
        with torch.compiler.set_stance("force_eager"):
            eager.append(step())
        compiled.append(step())
    e, c = statistics.median(eager), statistics.median(compiled)
    return {"first_compiled_step_s": first, "median_eager_s": e, "median_compiled_s": c, "ratio": c / e}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1, help="OMP threads of the engine process")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cache = root / "inductor-cache"  # empty: the compiled run's first step is a cold compile
        report = {"eager_before": run_engine(root, "eager-before", False, a.steps, a.threads, cache),
                  "compiled_cold": run_engine(root, "compiled-cold", True, a.steps, a.threads, cache),
                  "compiled_warm": run_engine(root, "compiled-warm", True, a.steps, a.threads, cache),
                  "eager_after": run_engine(root, "eager-after", False, a.steps, a.threads, cache)}
        report["interleaved"] = interleaved(a.steps, a.threads, cache)
    before, after = report["eager_before"], report["eager_after"]
    eager = {k: (before[k] + after[k]) / 2 for k in ("first_step_s", "median_step_s")}
    report["eager_after_vs_before"] = after["median_step_s"] / before["median_step_s"]  # 1.0 on a quiet machine
    for name in ("compiled_cold", "compiled_warm"):
        r = report[name]
        r["step_time_ratio_vs_eager"] = r["median_step_s"] / eager["median_step_s"]
        r["compile_s"] = r["first_step_s"] - eager["first_step_s"]  # the first step's extra time
    report["setup"] = {"model": TINY["model"], "micro_batch_size": TINY["train"]["micro_batch_size"], "steps": a.steps,
                       "threads": a.threads, "cpus": os.cpu_count(), "load1": os.getloadavg()[0]}
    print(json.dumps(report, indent=1))
    for name in ("compiled_cold", "compiled_warm"):
        r = report[name]
        print(f"{name}: step time {r['median_step_s'] * 1e3:.1f} ms vs eager {eager['median_step_s'] * 1e3:.1f} ms "
              f"(ratio {r['step_time_ratio_vs_eager']:.2f}); first step {r['first_step_s']:.1f} s (compile ~{r['compile_s']:.1f} s)")
    print(f"eager after / eager before: {report['eager_after_vs_before']:.2f} (the machine's noise)")
    i = report["interleaved"]
    print(f"interleaved in one process: compiled {i['median_compiled_s'] * 1e3:.1f} ms vs eager {i['median_eager_s'] * 1e3:.1f} ms "
          f"(ratio {i['ratio']:.2f})")


if __name__ == "__main__":
    main()
