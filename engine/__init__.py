"""The training engine: what torchrun starts on every rank (`python -m engine`)."""
from __future__ import annotations

import atexit
import gc
import os
import sys


def exit_now(code: int) -> None:
    """Run the atexit handlers, flush stdio, and end the process without the interpreter's finalization.

    Once run_end is written and the process group is gone, finalization only costs: a process that
    imported torch walks millions of objects in its last collection (bench/engine_exit.py), and a
    rank once hung there for minutes after a stop, in C code past every Python frame (thread
    shutdown or a destructor), with its work already done."""
    gc.freeze()
    try:
        atexit._run_exitfuncs()  # multiprocessing's (DataLoader workers, temp dirs) and the user's
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
