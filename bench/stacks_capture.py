"""What `mt stacks` costs: the time to take 4 ranks' stacks, and how long each rank stops for it.

    .venv/bin/python bench/stacks_capture.py [--ranks 4] [--repeat 5] [--torch] [--py-spy]

A launcher naming a scratch run directory starts N ranks (RANK set, stderr into logs/rank<N>.log,
the dump installed by mt.stacks unless --py-spy, --torch: torch imported first); each spins in a 40-frame-deep
loop beside two idle threads and records every gap of its loop over 0.2 ms (wall) or 0.1 ms (its thread's CPU
time: the handler's own work, without the waits of a loaded machine). Per capture: its wall
time (signal to verdict.json), and per rank the longest gap while it ran (the pause the dump
cost) beside the longest gap in as long a window just before (the machine's own noise).
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

RANK = '''
import json, os, sys, threading, time
if "--torch" in sys.argv:
    import torch  # noqa: F401
from mt.contract.ranklog import redirect_output
from mt.stacks import install_stack_dump
run = sys.argv[sys.argv.index("--run-dir") + 1]
from pathlib import Path
redirect_output(Path(run, "logs", f"rank{os.environ['RANK']}.log"))
if "--py-spy" not in sys.argv:
    install_stack_dump()
for _ in range(2):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
gaps, out = [], os.path.join(run, f"gaps{os.environ['RANK']}.json")
def spin(depth):
    if depth:
        return spin(depth - 1)
    last, cpu_last = time.perf_counter(), time.thread_time()
    while not os.path.exists(os.path.join(run, "stop")):
        for _ in range(2000):
            now, cpu = time.perf_counter(), time.thread_time()
            if now - last > 2e-4 or cpu - cpu_last > 1e-4:
                gaps.append((time.time(), now - last, cpu - cpu_last))
            last, cpu_last = now, cpu
    json.dump(gaps, open(out, "w"))
open(os.path.join(run, f"ready{os.environ['RANK']}"), "w").close()
spin(40)
'''
LAUNCHER = "import os, subprocess, sys; n = int(sys.argv[1]); cmd = sys.argv[2:]; " \
           "ps = [subprocess.Popen(cmd, env={**os.environ, 'RANK': str(r)}) for r in range(n)]; [p.wait() for p in ps]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--torch", action="store_true")
    p.add_argument("--py-spy", action="store_true", help="ranks without the dump: every stack read by py-spy")
    args = p.parse_args()
    from tui.stacks.capture import capture, find_ranks

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        (run / "logs").mkdir(parents=True)
        (run / "config.json").write_text("{}")
        env = {k: v for k, v in os.environ.items() if k != "RANK"} | {"PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-c", LAUNCHER, str(args.ranks), sys.executable, "-c", RANK, "--run-dir", str(run)]
        cmd += (["--torch"] if args.torch else []) + (["--py-spy"] if args.py_spy else [])
        launcher = subprocess.Popen(cmd, env=env)
        deadline = time.monotonic() + 120
        while len(list(run.glob("ready*"))) < args.ranks and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(find_ranks(run)) == args.ranks
        time.sleep(0.5)  # every rank spinning
        windows = []
        for _ in range(args.repeat):
            t0 = time.time()
            cap = capture(run)
            windows.append((t0, time.time(), cap.seconds, [s.source for s in cap.stacks]))
            time.sleep(1.0)
        (run / "stop").write_text("")
        launcher.wait(60)
        gaps = {r: json.loads((run / f"gaps{r}.json").read_text()) for r in range(args.ranks)}
    walls = [w[2] for w in windows]
    print(f"{args.ranks} ranks{' (torch imported)' if args.torch else ''}, {args.repeat} captures, paths {windows[0][3]}")
    print(f"capture wall: median {statistics.median(walls) * 1e3:.0f} ms, max {max(walls) * 1e3:.0f} ms")
    for col, what in ((1, "wall (scheduling included)"), (2, "CPU of the rank's main thread (the handler's own work)")):
        pauses, noise = [], []
        for t0, t1, _, _ in windows:
            for r in range(args.ranks):
                pauses.append(max((g[col] for g in gaps[r] if t0 <= g[0] <= t1 + 0.05), default=0.0))
                noise.append(max((g[col] for g in gaps[r] if t0 - (t1 - t0) - 0.5 <= g[0] < t0 - 0.5), default=0.0))
        print(f"longest stop per rank, {what}: during a capture median {statistics.median(pauses) * 1e3:.2f} ms, "
              f"max {max(pauses) * 1e3:.2f} ms; the window before it median {statistics.median(noise) * 1e3:.2f} ms, "
              f"max {max(noise) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
