"""`python -P -m mt.script --run-dir DIR --attempt N -- train.py ARGS`: a user's script as a worker.

What the supervisor (or torchrun) starts on each rank of a script run: it sends the rank's
output to logs/rank<N>.log, tells `mt.init` which run to join (MT_RUN_DIR, MT_ATTEMPT), then
runs the script as `python train.py ARGS` would: `__main__`, its own folder first on sys.path.
`--run-dir` in this command line is how mt finds the run's processes (tui/supervise/procs.py).
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

from mt.contract.paths import RunPaths
from mt.contract.ranklog import redirect_output
from mt.run import ENV_ATTEMPT, ENV_RUN_DIR


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mt.script", description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--attempt", type=int, default=1)
    parser.add_argument("script", type=Path)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    paths = RunPaths.of_process(ns.run_dir.resolve())   # its node's folder in a job's shared run directory
    redirect_output(paths.rank_log(int(os.environ.get("RANK", 0))))
    os.environ[ENV_RUN_DIR] = str(paths.root)
    os.environ[ENV_ATTEMPT] = str(ns.attempt)
    script = ns.script.resolve()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))  # as `python train.py` does (and -P left out the cwd)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
