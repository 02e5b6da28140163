"""How long `mt --help` (and other torch-free commands) take from a cold process.

Usage: python bench/cli_startup.py [--repeat N]. Prints min / median wall seconds per command
and whether torch was imported. Target: `mt --help` <= 0.25 s.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Runs the CLI in-process and reports whether torch got imported (the CLI must never load it).
_PROBE = (
    "import sys\n"
    "sys.argv = ['mt', *sys.argv[1:]]\n"
    "import tui.cli\n"
    "try:\n"
    "    tui.cli.main()\n"
    "except SystemExit:\n"
    "    pass\n"
    "sys.stderr.write('TORCH=%s\\n' % ('torch' in sys.modules))\n"
)


def time_command(args: list[str], repeat: int) -> tuple[float, float, bool]:
    """(min s, median s, torch imported) over `repeat` cold runs of `mt ARGS`."""
    times = []
    torch_loaded = False
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        torch_loaded |= "TORCH=True" in proc.stderr
    return min(times), statistics.median(times), torch_loaded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "python -c pass": None,
            "mt --help": ["--help"],
            "mt launch --help": ["launch", "--help"],
            "mt ls (empty)": ["ls", tmp],
        }
        print(f"{'command':<20} {'min s':>7} {'median s':>9}  torch")
        for name, cmd in cases.items():
            if cmd is None:
                ts = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    subprocess.run([sys.executable, "-c", "pass"])
                    ts.append(time.perf_counter() - t0)
                print(f"{name:<20} {min(ts):7.3f} {statistics.median(ts):9.3f}  -")
                continue
            lo, med, torch_loaded = time_command(cmd, args.repeat)
            print(f"{name:<20} {lo:7.3f} {med:9.3f}  {'LOADED' if torch_loaded else 'no'}")
    print(f"target: mt --help <= 0.25 s; load average now {Path('/proc/loadavg').read_text().split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
