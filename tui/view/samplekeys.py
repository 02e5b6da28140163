"""The dashboard's `v`: the samples view (tui/widgets/samples.py) over the run its watcher follows."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.binding import Binding

from tui.widgets.samples import SamplesScreen, samples_text

SAMPLES_BINDING = Binding("v", "samples", "Samples", id="samples", show=False,
                          tooltip="The newest eval's generated samples ([eval] prompts) and its own numbers")
LOCK_WAIT_S = 0.05


class SampleKeys:
    """Mixed into the dashboard screen, which has `watcher` (its lock guards the state the worker updates)."""

    def action_samples(self: Any) -> None:
        self.app.push_screen(SamplesScreen(lambda: _read(self.watcher)))


def _read(watcher: Any) -> Text | None:
    if not watcher.lock.acquire(timeout=LOCK_WAIT_S):
        return None
    try:
        return samples_text(watcher.follower.state.evals)
    finally:
        watcher.lock.release()
