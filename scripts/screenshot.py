"""The README's picture: a real 2-process CPU run of presets/tiny-cpu.toml, shown by the dashboard
at 120x36 and saved as SVG. Rerun it whenever the dashboard's layout changes:

    .venv/bin/python scripts/screenshot.py [--out docs/dashboard.svg] [--steps 100]
"""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mt.contract.status import FINAL_STATES
from tui.read.follower import load_run_state
from tui.view.app import MtApp

ROOT = Path(__file__).resolve().parents[1]
SIZE = (120, 36)
WAIT_S = 900.0   # a loaded machine may take minutes to reach the steps asked for


def mt(*args: str) -> str:
    """Run the `mt` command of this checkout; its stdout."""
    done = subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=120)
    return done.stdout


def wait_until(what: str, cond, deadline: float) -> None:
    """Poll cond() until it holds; fail with `what` at the deadline."""
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshot: gave up waiting for {what}")
        time.sleep(0.5)


async def shoot(run: Path, out: Path) -> None:
    """Open the dashboard on the live run, let it settle with a few system samples, save it."""
    app = MtApp(run)
    async with app.run_test(size=SIZE) as pilot:
        deadline = time.monotonic() + 120
        while not (app.settled() and app.watcher.system.samples >= 5):
            if time.monotonic() > deadline:
                raise SystemExit("screenshot: the dashboard did not settle in 120 s")
            await pilot.pause(0.2)
        await pilot.pause(1.0)   # a frame more: the header's clock and the bars at their newest
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.svg")
    p.add_argument("--steps", type=int, default=100, help="shoot once the run has logged this many steps")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="mt-screenshot-") as tmp:
        printed = mt("launch", "presets/tiny-cpu.toml", "--detach", "--runs-dir", tmp)
        run = next(Path(tmp).iterdir())
        print(printed.strip())
        try:
            wait_until(f"step {args.steps}", lambda: (load_run_state(run).step or 0) >= args.steps,
                       time.monotonic() + WAIT_S)
            asyncio.run(shoot(run, args.out.resolve()))
        finally:
            state = load_run_state(run).state
            if state not in FINAL_STATES:
                mt("kill", str(run))
                wait_until("the run to end", lambda: load_run_state(run).state in FINAL_STATES,
                           time.monotonic() + 60)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
