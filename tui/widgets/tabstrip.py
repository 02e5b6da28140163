"""The one-line strip of tabs in a small terminal: which pane is shown, which keys show the others."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class TabStrip(Static):
    """Re-rendered only when its items change."""

    _items: list[tuple[str, bool]] | None = None

    def show(self, items: list[tuple[str, bool]]) -> None:
        """items: (label, is the active tab), from `tui.state.layout.strip_items`."""
        if items == self._items:
            return
        self._items = items
        t = Text()
        for label, active in items:
            t.append(f" {label} ", style="reverse bold" if active else "")
            t.append(" ")
        if items:
            t.append(" Tab: next", style="dim")
        self.update(t)
