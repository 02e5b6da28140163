"""What a plot draws, shared by the light widget (`plots.py`) and its figure (`figure.py`); numpy-free."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tui.state.plotmath import SmoothCache
    from tui.state.series import Series

ROWS_SPENT = 4  # rows of a figure that are not canvas: title, two x axes, x tick labels


@dataclass
class Curve:
    """One series on a plot; `smooth` False for sparse ones like validation loss."""

    label: str
    series: Series
    color: str
    smooth: bool = True
    cache: SmoothCache | None = None  # the smoothed curve, made with the first figure
    raw: bool = True                  # the raw points in grey under the smoothed line (off: overlaid runs)
    marks_bad: bool = True            # non-finite points as red x's; off where they only mean "not reported"
    vertical: bool = False            # marks (RunSeries.marks): a vertical line at each x, coloured by its y


MARK_COLORS = ("red", "blue")  # by a mark's y: a rollback (RunSeries MARK_ROLLBACK), a knob turned (MARK_KNOB)
