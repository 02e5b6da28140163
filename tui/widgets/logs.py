"""Logs panel: the tail of one rank's log."""
from __future__ import annotations

from textual.widgets import RichLog


class LogsPanel(RichLog):
    """Appends new lines; `reset` clears it when the shown rank changes."""

    def show(self, rank: int, lines: list[str], reset: bool) -> None:
        if reset:
            self.clear()
            self.border_title = f"4 logs: rank{rank}.log  (g: next rank)"
        for line in lines:
            self.write(line, scroll_end=False)
        if lines:
            self.scroll_end(animate=False, immediate=False)

    def on_resize(self) -> None:
        # a tail view stays at the tail when the layout around it changes
        self.scroll_end(animate=False, immediate=False)
