"""Logs panel: the tail of one rank's log, long lines wrapped to the panel's width, and the
unfinished last line (a running progress bar) below them, replaced as it changes."""
from __future__ import annotations

from collections import deque

from textual.geometry import Size
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
        self._pending = ""          # the unfinished last line shown under the others
        self._pending_rows = 0      # the rows it takes, taken away when it changes

    def show(self, rank: int, lines: list[str], reset: bool, pending: str | None = None) -> None:
        """Append `lines`; `pending` replaces the unfinished last line (None: keep it)."""
        if reset:
            self.clear()
            self._raw.clear()
            self._pending, self._pending_rows = "", 0
            self.border_title = f"4 logs: rank{rank}.log  (g: next rank)"
        lines = [safe_text(line, lines=True) for line in lines]   # what terminal_line left (an OSC sequence, a NUL) is shown, never obeyed
        pending = self._pending if pending is None else safe_text(pending)
        if not lines and pending == self._pending and (self._pending_rows or not pending or not self._size_known):
            return
        self._drop_pending()
        self._raw.extend(lines)
        for line in lines:
            self.write(line, scroll_end=False)
        self._write_pending(pending)
        self.scroll_end(animate=False, immediate=False)

    def _write_pending(self, text: str) -> None:
        """Write the unfinished line last and count its rows (not before the panel has a size:
        RichLog defers such writes, and a deferred one could not be taken away)."""
        self._pending = text
        if text and self._size_known:
            rows, start = len(self.lines), self._start_line
            self.write(text, scroll_end=False)
            self._pending_rows = len(self.lines) - rows + self._start_line - start   # max_lines may trim the top

    def _drop_pending(self) -> None:
        if self._pending_rows:
            del self.lines[-min(self._pending_rows, len(self.lines)):]
            self._line_cache.clear()   # its rows are keyed by index: the next lines take them
            self.virtual_size = Size(self._widest_line_width, len(self.lines))
            self.refresh()
            self._pending_rows = 0

    def on_resize(self) -> None:
        # RichLog wraps a line once, when written: a new width wraps them all again
        width = self.scrollable_content_region.width
        if width != self._wrapped_at and (self._raw or self._pending):
            self.clear()
            self._pending_rows = 0
            for line in self._raw:
                self.write(line, scroll_end=False)
            self._write_pending(self._pending)
        self._wrapped_at = width
        if self._pending and not self._pending_rows:
            # the first size comes to RichLog's own handler after this one: write it after that
            self.call_after_refresh(self._pending_late)
        # a tail view stays at the tail when the layout around it changes
        self.scroll_end(animate=False, immediate=False)

    def _pending_late(self) -> None:
        if self._pending and not self._pending_rows and self._size_known:
            self._write_pending(self._pending)
            self.scroll_end(animate=False, immediate=False)
