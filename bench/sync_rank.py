"""One rank of mt's engine under torch's sync debug mode, for bench/gpu_check.py's syncs part.

    torchrun ... bench/sync_rank.py TIMES_FILE --run-dir RUN --attempt 1

Every "synchronizing CUDA operation" warning the rank's Python code triggers appends its time
(epoch seconds) to TIMES_FILE.rank<RANK>; the check counts them between the run's step events. On a machine
without CUDA the mode cannot be set and nothing is warned of; GPU_CHECK_SYNC_PROBE=1 (--dry) warns
once, before the engine starts, so the counting itself is checked there too.
"""
from __future__ import annotations

import os
import runpy
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SYNC_WARNING = "synchronizing CUDA operation"


def main() -> None:
    times_file, sys.argv = sys.argv[1], ["engine", *sys.argv[2:]]
    sys.path.insert(0, str(REPO))
    import torch

    out = open(f"{times_file}.rank{os.environ.get('RANK', '0')}", "a", buffering=1)  # for the whole run; line-buffered: each warning lands at once
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # type: ignore[no-untyped-def]
        if SYNC_WARNING in str(message):
            out.write(f"{time.time()!r}\n")
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    # "always": Python shows a warning once per code location by default, and the loop repeats them
    warnings.filterwarnings("always", message=f".*{SYNC_WARNING}")
    if torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode("warn")
    if os.environ.get("GPU_CHECK_SYNC_PROBE") == "1":
        warnings.warn(f"called a {SYNC_WARNING} (a stand-in: gpu_check --dry)", stacklevel=1)
    runpy.run_module("engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
