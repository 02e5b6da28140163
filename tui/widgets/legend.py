"""The compare view's header: one row per run, its colour swatch first, so it is the legend too."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.state.compare import RunLine, run_color, table_rows
from tui.widgets.header import STATE_STYLE

SWATCH = "━━ "


def legend_text(lines: list[RunLine], note: str = "") -> Text:
    """The table as rich text: each run's row starts with a swatch of its curves' colour."""
    rows = table_rows(lines)
    out = [Text(" " * len(SWATCH) + "  ".join(rows[0]).rstrip(), style="bold")]
    for i, (line, cells) in enumerate(zip(lines, rows[1:])):
        _, ansi = run_color(i)
        row = Text.assemble((SWATCH, f"bold color({ansi})"), (cells[0], f"color({ansi})"), "  ",
                            (cells[1], STATE_STYLE.get(line.state.strip(), "bold red")), "  ", "  ".join(cells[2:]))
        row.rstrip()
        out.append(row)
    if note:
        out.append(Text(note, style="dim"))
    return Text("\n").join(out)


class CompareLegend(Static):
    """Shows `legend_text` for the runs' latest states."""

    _last: Text | None = None

    def show(self, lines: list[RunLine], note: str = "") -> None:
        text = legend_text(lines, note)
        if text != self._last:  # an unchanged header costs no repaint
            self._last = text
            self.update(text, layout=False)
