"""The training engine: what torchrun starts on every rank (`python -m engine`)."""
from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import time


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


def guard_exit(code: int, grace_s: float) -> None:
    """From now on this process ends within `grace_s` seconds with `code`, whatever of its shutdown
    hangs: its work is done, and a rank stuck in destroy_process_group (pytorch#75097) or an exit
    handler would keep torchrun, the supervisor and the other ranks' collectives waiting."""
    def _end() -> None:
        time.sleep(grace_s)
        print(f"{time.strftime('%H:%M:%S')} shutdown did not finish within launch.exit_grace_s = {grace_s:g} s "
              f"(destroy_process_group or an exit handler hung); this rank exits now with {code}, its work done",
              flush=True)
        os._exit(code)

    threading.Thread(target=_end, name="mt-exit-guard", daemon=True).start()
