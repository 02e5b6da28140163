"""The stack dump on SIGUSR2 that mt's engine and the `mt` library both install (docs/run-directory.md, stacks/)."""
from __future__ import annotations

import faulthandler
import signal
import sys

DUMP_SIGNAL = signal.SIGUSR2


def install_stack_dump() -> bool:
    """`kill -USR2 PID` writes every thread's stack to stderr (the rank log); True if installed.

    Only a SIG_DFL disposition is replaced (a handler the script set itself stays), and nothing
    here may fail the run: a process without a usable stderr simply has no dump.
    """
    try:
        if signal.getsignal(DUMP_SIGNAL) is not signal.SIG_DFL:
            return False
        faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True)
        return True
    except (ValueError, OSError, AttributeError, RuntimeError):  # no stderr, or one without a file descriptor
        return False
