"""Host-device synchronizations, counted as CUDA reports them (`torch.cuda.set_sync_debug_mode("warn")`):
the loop's `[debug] count_syncs` and bench/gpu_check.py both count through `SyncCounter`."""
from __future__ import annotations

import warnings
from typing import Any

import torch

_MESSAGE = "called a synchronizing CUDA operation"  # torch's warning text for each sync in "warn" mode


class SyncCounter:
    """Between `start()` and `stop()` every synchronizing CUDA operation of this thread is counted; a CPU run
    has none (0). `where` keeps each one's warning (its message names the operation)."""

    def __init__(self) -> None:
        self.where: list[str] = []
        self._catch: Any = None
        self._seen: list[warnings.WarningMessage] = []
        self._mode: int | str = 0

    def start(self) -> None:
        self._catch = warnings.catch_warnings(record=True)
        self._seen = self._catch.__enter__()
        warnings.simplefilter("always")
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self._mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> int:
        """The number of synchronizations since start(); other warnings raised meanwhile are re-issued."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.set_sync_debug_mode(self._mode)
        self._catch.__exit__(None, None, None)
        self.where = [str(w.message) for w in self._seen if _MESSAGE in str(w.message)]
        for w in self._seen:
            if _MESSAGE not in str(w.message):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return len(self.where)
