"""Engine throughput vs a minimal DDP loop, and the cost of the engine's bookkeeping, in one script.

    .venv/bin/python bench/engine_vs_baseline.py [--rounds 3] [--steps 60] [--nproc 2] [--model gpt|charlstm]

Runs baseline and engine alternately (A B A B ...) on the same config and reports the ratio of
median step throughput; then times events + heartbeat + control polling per step in-process and
reports it as a share of the engine's median step time. `--model charlstm` trains the user
model and dataset of examples/charlstm (a `kind = "python"` preset) on both sides; with
`--nproc 1` the baseline is a plain single-process loop (no process group, no DDP) and the
engine runs as `mt` runs one process.
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

from mt.contract.eventlog import EventWriter
from mt.contract.heartbeat import Heartbeat
from mt.contract.inbox import ControlInbox
from mt.contract.jsonl import read_events
from mt.contract.preset import config_from_dict

CONFIG = {
    "run": {"name": "bench", "seed": 1},
    "launch": {"device": "cpu"},
    "model": {"vocab_size": 256, "n_layer": 4, "n_head": 4, "d_model": 128, "seq_len": 128},
    "data": {"source": "synthetic", "synthetic_samples": 4096, "val_fraction": 0.0, "num_workers": 1},
    "train": {"micro_batch_size": 8, "grad_accum_steps": 2, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 5},
}


CHARLSTM = {
    "run": {"workdir": str(REPO)},
    "model": {"kind": "python", "factory": "examples.charlstm.model:build", "seq_len": 64,
              "args": {"vocab": 16, "hidden": 128, "layers": 2, "dropout": 0.1}},
    "data": {"source": "python", "factory": "examples.charlstm.data:build", "args": {"n": 4096, "seq_len": 64, "val_n": 0},
             "val_fraction": 0.0, "num_workers": 1},
}


def torchrun(nproc: int, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Under torchrun, or for one process as a plain `python` (what mt launches for one rank)."""
    if nproc == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--model", choices=["gpt", "charlstm"], default="gpt")
    a = ap.parse_args()
    warmup = 10
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // a.nproc)), PYTHONPATH=str(REPO))
    base, eng, eng_step = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            raw = json.loads(json.dumps(CONFIG))
            if a.model == "charlstm":
                for section, values in CHARLSTM.items():
                    raw.setdefault(section, {}).update(values)
            raw["launch"]["nproc_per_node"] = a.nproc
            raw["train"]["max_steps"] = a.steps
            cfg = config_from_dict(raw, "bench")
            run = Path(tmp) / f"run{r}"
            run.mkdir()
            (run / "config.json").write_text(json.dumps(cfg.to_dict()))
            out = torchrun(a.nproc, ["bench/ddp_baseline.py", str(run / "config.json"), str(warmup)], env)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            base.append(got["tokens_per_s"])
            torchrun(a.nproc, ["-m", "engine", "--run-dir", str(run)], env)
            steps = [e for e in read_events(run / "events.jsonl") if e["kind"] == "step"][warmup:]
            times = sorted(s["step_time_s"] for s in steps)
            tokens = cfg.world_size * cfg.train.micro_batch_size * cfg.train.grad_accum_steps * cfg.model.seq_len
            eng.append(tokens / times[len(times) // 2])
            eng_step.append(times[len(times) // 2])
            wait = statistics.median(s["data_wait_s"] for s in steps)
            print(f"round {r + 1}: baseline {base[-1]:.0f} tok/s, engine {eng[-1]:.0f} tok/s, ratio {eng[-1] / base[-1]:.3f} "
                  f"(data wait per step: baseline {got['median_data_wait_s'] * 1e3:.1f} ms, engine {wait * 1e3:.1f} ms)", flush=True)

        # bookkeeping per step: one step event, one heartbeat, one control poll (rank 0's extra work)
        d = Path(tmp) / "io"
        (d / "heartbeat").mkdir(parents=True)
        writer, beat, inbox = EventWriter(d / "events.jsonl"), Heartbeat(d / "heartbeat/rank0", 0, 1), ControlInbox(d / "control")
        sample = [e for e in read_events(Path(tmp) / "run0/events.jsonl") if e["kind"] == "step"][-1]
        fields = {k: v for k, v in sample.items() if k not in ("v", "t", "kind")}
        n = 2000
        t0 = time.perf_counter()
        for i in range(n):
            writer.emit("step", **fields)
            beat.beat(i)
            inbox.poll()
        per_step = (time.perf_counter() - t0) / n
        with_idx, without = emit_cost(Path(tmp) / "emit", fields)
    ratio = statistics.median(e / b for e, b in zip(eng, base))
    share = per_step / statistics.median(eng_step)
    print(f"engine / minimal DDP loop tokens/s: median ratio {ratio:.3f} over {a.rounds} rounds (goal >= 0.98)")
    print(f"events + heartbeat + control poll: {per_step * 1e6:.0f} us per step = {100 * share:.3f}% of a {statistics.median(eng_step) * 1e3:.0f} ms step (goal <= 1%)")
    print(f"step event with its events.idx record: {with_idx * 1e6:.1f} us, without: {without * 1e6:.1f} us "
          f"(ratio {with_idx / without:.2f}, +{(with_idx - without) * 1e6:.1f} us per step)")


def emit_cost(d: Path, fields: dict, rounds: int = 7, n: int = 2000) -> tuple[float, float]:
    """Median seconds per step event with and without the binary index, alternating rounds."""
    d.mkdir(parents=True)
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for index in (True, False) if r % 2 else (False, True):
            writer = EventWriter(d / f"events-{index}-{r}.jsonl", index=index)
            t0 = time.perf_counter()
            for _ in range(n):
                writer.emit("step", **fields)
            times[index].append((time.perf_counter() - t0) / n)
            writer.close()
    return statistics.median(times[True]), statistics.median(times[False])


if __name__ == "__main__":
    main()
