"""The training engine: what torchrun starts on every rank (`python -m engine`)."""
from __future__ import annotations

import gc
import sys


def exit_now(code: int) -> None:
    """Exit without the interpreter's last full collection (atexit and stdio flushing still run).

    A process that imported torch still references everything it made at exit: that collection
    walks millions of objects to free nothing the OS would not (bench/engine_exit.py)."""
    gc.freeze()
    sys.exit(code)
