"""The one poll-until-deadline loop: every wait on a file, a process or Slurm's queue goes through it."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def poll_until(probe: Callable[[], T], timeout_s: float, every_s: float, done: Callable[[T], bool] = bool) -> T:
    """Call `probe` every `every_s` until `done` holds for its answer or `timeout_s` has passed; the last answer.

    The probe runs at least once, and once more at the deadline, so a wait of 0 still looks."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if done(got) or time.monotonic() >= deadline:
            return got
        time.sleep(max(0.0, min(every_s, deadline - time.monotonic())))
