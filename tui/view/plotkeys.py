"""The keys both viewers share (the dashboard and the compare view): smoothing, log-y, help."""
from __future__ import annotations

from typing import Any

from textual.binding import Binding

from tui.widgets.dialogs import HelpScreen, help_rows

SMOOTHING_BINDINGS = [
    Binding("e", "smoothing(-0.1)", "Smooth−", id="smooth-down", tooltip="Less smoothing (0 = raw)"),
    Binding("E", "smoothing(0.1)", "Smooth+", id="smooth-up", tooltip="More smoothing"),
    Binding("l", "toggle_logy", "Log-y", id="logy", tooltip="Logarithmic y axis"),
]
HELP_BINDING = Binding("question_mark", "help", "Help", id="help", key_display="?", tooltip="This help")


class PlotKeys:
    """Mixed into an App or a Screen that declares the reactive attributes `smoothing` and `logy`."""

    smoothing: Any
    logy: Any

    def action_smoothing(self, delta: float) -> None:
        self.smoothing = round(min(0.99, max(0.0, self.smoothing + delta)), 2)

    def action_toggle_logy(self) -> None:
        self.logy = not self.logy

    def action_help(self: Any) -> None:
        self.app.push_screen(HelpScreen(help_rows(self.BINDINGS)))
