"""What the supervisor costs: time from `mt launch` to the first step, and its own CPU use.

Usage: python bench/cli_supervisor.py [--steps N]. Launches a small 2-process CPU run detached,
samples the supervisor's CPU time while it runs and prints the numbers.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

PRESET = """[run]
name = "bench"
runs_dir = "{runs}"
[launch]
nproc_per_node = 2
device = "cpu"
[model]
vocab_size = 64
n_layer = 1
n_head = 2
d_model = 32
seq_len = 32
[train]
micro_batch_size = 4
max_steps = {steps}
lr = 1e-3
min_lr = 1e-4
[faults]
step_sleep_s = 0.05
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        preset = Path(tmp) / "bench.toml"
        preset.write_text(PRESET.format(runs=Path(tmp) / "runs", steps=args.steps))
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(preset), "--detach"],
                             capture_output=True, text=True, check=True).stdout.strip()
        t_launch = time.monotonic() - t0
        run_dir = Path(out)
        sup = psutil.Process(json.loads((run_dir / "status.json").read_text())["supervisor_pid"])
        t_first = cpu = None
        while True:
            try:
                cpu = sum(sup.cpu_times()[:2])
            except psutil.NoSuchProcess:
                break
            if t_first is None and (run_dir / "events.jsonl").exists() and '"step"' in (run_dir / "events.jsonl").read_text():
                t_first = time.monotonic() - t0
            time.sleep(0.2)
        total = time.monotonic() - t0
        status = json.loads((run_dir / "status.json").read_text())
        samples = len((run_dir / "system.jsonl").read_text().splitlines())
        print(f"mt launch --detach returned after {t_launch:.2f} s")
        print(f"first step event after           {t_first:.1f} s")
        print(f"run {status['state']} after            {total:.1f} s ({args.steps} steps)")
        print(f"supervisor CPU time              {cpu:.2f} s = {100 * cpu / total:.1f}% of one core")
        print(f"system.jsonl samples             {samples} ({samples / total:.2f}/s)")
        print(f"load average                     {Path('/proc/loadavg').read_text().split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
