"""The dashboard's keys 1-5: focus a panel (in a small terminal, show its tab)."""
from __future__ import annotations

from textual.binding import Binding

FOCUS_BINDINGS = [
    Binding("1", "focus_panel(1)", "Plots", show=False, id="focus-1",
            tooltip="Focus the plots (in a small terminal: show the loss plot)"),
    Binding("2", "focus_panel(2)", "System", show=False, id="focus-2",
            tooltip="Focus the system panel (in a small terminal: show it)"),
    Binding("3", "focus_panel(3)", "Incidents", show=False, id="focus-3",
            tooltip="Focus the incidents (up/down selects one, its detail below)"),
    Binding("4", "focus_panel(4)", "Logs", show=False, id="focus-4", tooltip="Focus the logs"),
    Binding("5", "focus_panel(5)", "Small plots", show=False, id="focus-5",
            tooltip="The lr / tokens/s / metric and grad-norm plots (a tab of their own at 80×24)"),
]
