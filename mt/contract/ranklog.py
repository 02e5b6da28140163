"""logs/rank<N>.log: each training process's stdout and stderr, appended across attempts."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from mt.contract import door


def redirect_output(log_path: Path) -> None:
    """Send this process's stdout and stderr (and its children's) to its rank log, appending."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = door.open_append(log_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
