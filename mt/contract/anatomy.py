"""A rank's step anatomy: the last steps' time per part, carried in its heartbeat record as medians."""
from __future__ import annotations

from collections import deque

# the parts of a step, in seconds: all of it, waiting for the next batch, forward+backward (this
# rank's own work), the optimizer step, waiting in the step's collectives for the other ranks, and
# (a script's) the time inside mt's run.step (its agreement); the rest of a script's step is its own
PARTS = ("step_s", "data_s", "compute_s", "optim_s", "comm_s", "mt_s")
WINDOW = 20
# the medians are taken again after this many steps: a reader polls about once a second and the
# window moves slowly, while taking them costs ~10 µs (a quarter of that a step this way)
REFRESH = 4


class StepAnatomy:
    """The last `window` steps' parts; `fragment()` is their medians as the heartbeat's JSON field.

    `add` is a few appends (the training thread's cost); medians are taken when a beat is written,
    at most every `refresh` steps."""

    def __init__(self, window: int = WINDOW, refresh: int = REFRESH) -> None:
        self._parts: dict[str, deque[float]] = {k: deque(maxlen=window) for k in PARTS}
        self._refresh, self._since, self._fragment = refresh, refresh, ""

    def add(self, step_s: float, data_s: float | None = None, compute_s: float | None = None,
            optim_s: float | None = None, comm_s: float | None = None, mt_s: float | None = None) -> None:
        """One step's parts; None: a part this producer cannot see (it stays out of the record)."""
        for name, value in zip(PARTS, (step_s, data_s, compute_s, optim_s, comm_s, mt_s)):
            if value is not None:
                self._parts[name].append(value)
        self._since += 1

    def fragment(self) -> str:
        """`,"anatomy":{"n":N,"step_s":...}` (the parts seen), or "" before the first step."""
        n = len(self._parts["step_s"])
        if not n or self._since < self._refresh:
            return self._fragment
        self._since = 0
        fields = [f'"n":{n}']
        for name, values in self._parts.items():
            if values:
                ordered = sorted(values)  # one C call under the GIL: a list the training thread cannot change
                fields.append(f'"{name}":{max(ordered[len(ordered) // 2], 0.0):.4g}')
        self._fragment = ',"anatomy":{' + ",".join(fields) + "}"
        return self._fragment
