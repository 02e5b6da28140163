"""Logs panel: the tail of one rank's log, long lines wrapped to the panel's width."""
from __future__ import annotations

from collections import deque

from textual.widgets import RichLog

from tui.format.fmt import safe_text

MAX_LINES = 500


class LogsPanel(RichLog):
    """Appends new lines; `reset` clears it when the shown rank changes."""

    # the scrollbar's room is kept even while there is none: lines wrap to one width that
    # stays right when the log grows taller than the panel
    DEFAULT_CSS = """
    LogsPanel {
        scrollbar-gutter: stable;
    }
    """

    def __init__(self, **kw) -> None:
        # min_width 1: RichLog renders at least min_width (78) cells wide, wrapped or not
        super().__init__(max_lines=MAX_LINES, wrap=True, min_width=1, markup=False, **kw)
        self._raw: deque[str] = deque(maxlen=MAX_LINES)   # what was written, to wrap again
        self._wrapped_at = 0

    def show(self, rank: int, lines: list[str], reset: bool) -> None:
        if reset:
            self.clear()
            self._raw.clear()
            self.border_title = f"4 logs: rank{rank}.log  (g: next rank)"
        lines = [safe_text(line, lines=True) for line in lines]   # what terminal_line left (an OSC sequence, a NUL) is shown, never obeyed
        self._raw.extend(lines)
        for line in lines:
            self.write(line, scroll_end=False)
        if lines:
            self.scroll_end(animate=False, immediate=False)

    def on_resize(self) -> None:
        # RichLog wraps a line once, when written: a new width wraps them all again
        width = self.scrollable_content_region.width
        if width != self._wrapped_at and self._raw:
            self.clear()
            for line in self._raw:
                self.write(line, scroll_end=False)
        self._wrapped_at = width
        # a tail view stays at the tail when the layout around it changes
        self.scroll_end(animate=False, immediate=False)
