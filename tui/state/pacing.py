"""When a viewer's plots redraw for new points: all together, spaced by what their builds cost."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Pacing:
    """One clock for every plot on screen, so no plot shows an older step than another.

    A plotext build costs tens of ms, so while points keep coming the data-driven redraws are
    spaced (`min_interval_s`, longer when the builds cost more); once points stop for `quiet_s`
    the plots catch up at once. Key presses, resizes and a new history never wait for it.
    """

    min_interval_s: float = 2.0
    quiet_s: float = 1.0
    cost_factor: float = 25.0  # builds take at most 1/cost_factor of the viewer's time
    _seen: tuple = field(default=(), repr=False)
    _seen_at: float = field(default=0.0, repr=False)
    _drawn_at: float = field(default=-math.inf, repr=False)

    def due(self, versions: tuple, build_s: float, now: float) -> bool:
        """Whether plots whose data changed redraw now; `build_s` is their builds' total cost."""
        if versions != self._seen:
            self._seen, self._seen_at = versions, now
        quiet = now - self._seen_at >= self.quiet_s
        return quiet or now - self._drawn_at >= self.interval(build_s)

    def interval(self, build_s: float) -> float:
        """The spacing of redraws while points keep coming, for builds that cost `build_s` in all."""
        return max(self.min_interval_s, self.cost_factor * build_s)

    def drawn(self, now: float) -> None:
        self._drawn_at = now
