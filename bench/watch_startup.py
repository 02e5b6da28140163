"""Time to the dashboard's first frame on a small run, as the user sees it in a terminal.

    python bench/watch_startup.py [RUN_DIR] [--repeat 7] [--base /tmp/mt-base]

Each repetition starts `mt watch RUN_DIR` in a fresh process on a pseudo-terminal (140x44) and
reads what it draws: the first frame is the moment the header with the newest step reaches the
terminal, counted from the spawn (interpreter start-up included). A probe wrapped around the CLI
stamps the phases inside the process (imports, mount, first poll, first data render), then
`settled` (the app's own `settled()`: everything read is drawn) and `painted` (the first frame
written after it: the plots' figures built and on the terminal), and quits. Medians over the repetitions.

--base runs a second checkout (e.g. `git worktree add /tmp/mt-base HEAD`) alternately with this
one in the same script, so both sides see the same machine load: that is the A/B comparison.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs `mt ARGS` in-process. A finder wraps the import of the app to stamp the phases; nothing
# else is imported ahead of the CLI, so lazy imports stay lazy. perf_counter is CLOCK_MONOTONIC
# on Linux, the same clock in the parent and the child.
PROBE = r"""
import functools, importlib.abc, importlib.util, json, os, sys, time
T = {"python": time.perf_counter()}

def stamp(name):
    if name not in T:
        T[name] = time.perf_counter()
        T["cpu " + name] = time.process_time()  # CPU seconds of the whole process so far

def patch(m):
    stamp("app_imported")
    App = m.MtApp
    View = getattr(m, "DashboardScreen", App)  # before the move to tui/view/: the App drew itself
    watch = sys.modules.get("tui.read.watcher") or sys.modules["tui.watch"]  # before the move: tui.watch
    wrap = lambda cls, name, before, after=None: setattr(cls, name, hooked(getattr(cls, name), before, after))
    def hooked(fn, before, after):
        @functools.wraps(fn)  # Textual passes the event only to handlers whose signature takes it
        def f(self, *a, **k):
            before(self)
            try:
                return fn(self, *a, **k)
            finally:
                after and after(self)
        return f
    def mounted(view):
        stamp("mount_end")
        app = view.app
        def check():
            if "settled" not in T and app.settled():
                stamp("settled")
                app.set_timer(1.0, app.exit)  # nothing left to paint
        app.set_interval(0.01, check)
    def displayed(app):
        if "settled" in T and "painted" not in T:  # the first frame written after settled()
            stamp("painted")
            app.call_later(app.exit)
    wrap(App, "run", lambda s: stamp("run"))
    wrap(App, "_display", lambda s: None, displayed)
    wrap(View, "on_mount", lambda s: stamp("mount"), mounted)
    wrap(View, "render_frame", lambda s: s.loaded and stamp("render_data"))
    wrap(watch.Watcher, "poll", lambda s: stamp("poll"), lambda s: stamp("poll_end"))

class Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name not in ("tui.view.app", "tui.app"):  # before the move: tui.app
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        self.inner, spec.loader = spec.loader, self
        return spec
    def create_module(self, spec):
        return self.inner.create_module(spec)
    def exec_module(self, m):
        self.inner.exec_module(m)
        patch(m)

sys.meta_path.insert(0, Hook())
sys.argv = ["mt", *sys.argv[1:]]
import tui.cli
stamp("cli_imported")
try:
    tui.cli.main()
except SystemExit:
    pass
T["tui"] = sys.modules["tui"].__file__
with open(os.environ["MT_BENCH_OUT"], "w") as f:
    json.dump(T, f)
"""

PHASES = ["python", "cli_imported", "app_imported", "run", "mount", "mount_end", "poll", "poll_end",
          "render_data", "first_frame", "settled", "painted",
          "cpu render_data", "cpu settled", "cpu painted"]  # CPU ms used by then: less load-dependent
ANSI = re.compile(rb"\x1b\[[0-9;?<>=$ ]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")


def last_step(run_dir: Path) -> int:
    with open(run_dir / "events.jsonl", "rb") as f:
        f.seek(max(0, f.seek(0, 2) - 65536))
        steps = [json.loads(line)["step"] for line in f.read().splitlines()[1:] if b'"kind":"step"' in line.replace(b" ", b"")]
    return steps[-1]


def one_run(tree: Path, run_dir: Path, marker: bytes, size: tuple[int, int], timeout_s: float = 30.0) -> dict:
    """Start `mt watch` from checkout `tree` on a pty; ms since spawn for every phase."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        out_path = tf.name
    env = dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor", MT_BENCH_OUT=out_path)
    env.pop("TEXTUAL", None)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", PROBE, "watch", str(run_dir)], cwd=tree, env=env,
                         stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    screen, first = b"", None
    try:
        while time.perf_counter() - t0 < timeout_s:  # until the child exits and all is read
            ready, _, _ = select.select([master], [], [], 0.005)
            if not ready:
                continue
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            screen = ANSI.sub(b"", screen[-20000:] + data)  # Textual draws on stderr, errors too
            if first is None and marker in screen[-4096 - len(data):]:
                first = time.perf_counter()
        p.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    try:
        stamps = json.loads(Path(out_path).read_text())
    except (OSError, ValueError):
        raise SystemExit(f"probe failed in {tree} (rc {p.returncode}):\n{screen[-3000:].decode(errors='replace')}")
    finally:
        os.unlink(out_path)
    if not str(stamps.pop("tui")).startswith(str(tree)):
        raise SystemExit(f"{tree}: the probe imported another checkout's tui")
    out = {k: v * 1000 if k.startswith("cpu ") else (v - t0) * 1000 for k, v in stamps.items()}
    out["first_frame"] = (first - t0) * 1000 if first is not None else float("nan")
    return out


def table(results: dict[str, list[dict]]) -> str:
    names = list(results)
    head = f"{'phase (ms since spawn)':<24}" + "".join(f"{n:>12}" for n in names)
    if len(names) == 2:
        head += f"{'delta':>10}"
    rows = [head]
    for ph in PHASES:
        seen = [[r[ph] for r in results[n] if r.get(ph, float("nan")) == r.get(ph)] for n in names]
        meds = [statistics.median(v) if v else float("nan") for v in seen]
        row = f"{ph:<24}" + "".join(f"{m:12.0f}" for m in meds)
        if len(names) == 2:
            row += f"{meds[1] - meds[0]:+10.0f}"
        missed = [f"{n}: {len(results[n]) - len(v)}" for n, v in zip(names, seen) if len(v) < len(results[n])]
        rows.append(row + (f"   (not seen in {', '.join(missed)} runs)" if missed else ""))
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", default="/tmp/smallrun")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--base", type=Path, help="another checkout to compare with (run alternately)")
    ap.add_argument("--size", default="140x44")
    args = ap.parse_args()
    run_dir = Path(args.run_dir)
    if not (run_dir / "events.jsonl").exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "watch_gen.py"), str(run_dir), "--steps", "100"],
                       check=True, cwd=ROOT)
    size = tuple(int(v) for v in args.size.split("x"))
    marker = f"step {last_step(run_dir):,}/".encode()
    trees = {"base": args.base.resolve(), "head": ROOT} if args.base else {"head": ROOT}
    print(f"run {run_dir}, marker {marker.decode()!r}, {args.repeat} repetitions, loadavg {Path('/proc/loadavg').read_text().split()[:3]}")
    results: dict[str, list[dict]] = {n: [] for n in trees}
    one_run(ROOT, run_dir, marker, size)  # page cache and .pyc warm for both sides alike
    if args.base:
        one_run(trees["base"], run_dir, marker, size)
    for i in range(args.repeat):
        for name, tree in (trees.items() if i % 2 == 0 else reversed(trees.items())):
            r = one_run(tree, run_dir, marker, size)
            results[name].append(r)
            print(f"  {i + 1} {name:<5} first frame {r['first_frame']:6.0f} ms   settled {r.get('settled', float('nan')):6.0f} ms"
                  f"   painted {r.get('painted', float('nan')):6.0f} ms")
    print(table(results))
    print(f"loadavg after {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
