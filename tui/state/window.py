"""The x window of the plots (zoom): all steps, the last fraction, or the last N steps, always
ending at the newest step so a live run is followed. Pure, and numpy-free: the app holds one
before any plot loads numpy (the points inside a window: `tui.state.plotmath.window_slice`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class XWindow:
    """Which steps the plots show: all, the last `size` fraction, or the last `size` steps;
    the right edge is always the newest step, so a live run is followed."""

    kind: str = "all"     # "all" | "frac" | "steps"
    size: float = 1.0

    def label(self) -> str:
        if self.kind == "frac":
            return f"last {self.size * 100:.3g}%"
        if self.kind == "steps":
            return f"last {int(self.size):,} steps"
        return "all steps"


MIN_WINDOW_STEPS = 10
MIN_WINDOW_FRAC = 0.001
CYCLE = (XWindow(), XWindow("frac", 0.1), XWindow("steps", 1000))  # what `w` steps through


def next_window(w: XWindow) -> XWindow:
    """`w`: all steps, then the last 10%, then the last 1,000 steps, then all again."""
    kinds = [c.kind for c in CYCLE]
    return CYCLE[(kinds.index(w.kind) + 1) % len(CYCLE)]


def narrow(w: XWindow) -> XWindow:
    """`[`: half the window (all steps narrows to the last half)."""
    if w.kind == "all":
        return XWindow("frac", 0.5)
    if w.kind == "frac":
        return XWindow("frac", max(MIN_WINDOW_FRAC, w.size / 2))
    return XWindow("steps", max(MIN_WINDOW_STEPS, int(w.size) // 2))


def widen(w: XWindow, span: float) -> XWindow:
    """`]`: twice the window; a window as wide as the run's `span` of steps is all of it."""
    if w.kind == "frac":
        return XWindow() if w.size * 2 >= 1.0 else XWindow("frac", w.size * 2)
    if w.kind == "steps":
        return XWindow() if w.size * 2 >= span else XWindow("steps", int(w.size) * 2)
    return w


def window_range(w: XWindow, lo: float, hi: float) -> tuple[float, float]:
    """The x range [lo', hi] the window shows of data spanning lo..hi."""
    if w.kind == "frac":
        return max(lo, hi - max(1.0, (hi - lo) * w.size)), hi
    if w.kind == "steps":
        return max(lo, hi - w.size), hi
    return lo, hi
