"""The compare view's logic, no Textual and no I/O: one colour per run, the runs table, x in steps or tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tui.format.fmt import NA, fmt_best, fmt_epoch, fmt_loss_cell, fmt_step, safe_text
from tui.state.runstate import RunState

if TYPE_CHECKING:
    import numpy as np

    from tui.state.series import Series

# plotext colour names and their ANSI codes (plotext._dict.color_codes); red stays for bad points
PALETTE: tuple[tuple[str, int], ...] = (
    ("cyan", 6), ("orange", 3), ("green+", 10), ("magenta+", 13),
    ("blue+", 12), ("red+", 9), ("white", 15), ("green", 2),
)
X_MODES = ("step", "tokens")


def run_color(i: int) -> tuple[str, int]:
    """Run i's colour (plotext name, ANSI code)."""
    return PALETTE[i % len(PALETTE)]


class TokenSeries:
    """A Series seen with x in tokens (step x tokens per step), so runs of different batch compare."""

    def __init__(self, series: Series, tokens_per_step: int) -> None:
        self.series = series
        self.tokens_per_step = tokens_per_step

    @property
    def version(self) -> int:
        return self.series.version

    @property
    def generation(self) -> int:
        return self.series.generation

    def __len__(self) -> int:
        return len(self.series)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.series.arrays()
        return x * float(self.tokens_per_step), y

    def last(self) -> float | None:
        return self.series.last()


def x_series(series: Series, st: RunState, mode: str) -> Series | TokenSeries | None:
    """What a run's curve plots for x `mode`; None when the run's tokens per step are unknown."""
    if mode == "step":
        return series
    return TokenSeries(series, st.tokens_per_step) if st.tokens_per_step else None


@dataclass
class RunLine:
    """One row of the compare view's header (and of `mt watch A B --once`)."""

    name: str
    state: str
    step: str
    loss: str
    best: str
    val: str
    tokens: str


HEADER = RunLine("RUN", "STATE", "STEP", "LOSS", "BEST", "VAL", "TOK/STEP")


def run_line(name: str, st: RunState) -> RunLine:
    """The header row of one run: its state (lost when its supervisor is gone), step, losses."""
    return RunLine(
        name=name, state=st.shown_state, step=fmt_step(st.step, st.max_steps, grouped=True) + fmt_epoch(st.epoch, " ep "),
        loss=fmt_loss_cell(st.loss),
        best=fmt_best(st.best_loss, st.best_loss_step, st.best_loss_partial),
        val=fmt_loss_cell(st.val_loss),
        tokens=f"{st.tokens_per_step:,}" if st.tokens_per_step else NA)


def table_rows(lines: list[RunLine]) -> list[list[str]]:
    """The header row and the runs' rows, each cell padded to its column's width."""
    rows = [[safe_text(c) for c in vars(r).values()] for r in (HEADER, *lines)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [[c.ljust(w) for c, w in zip(r, widths)] for r in rows]

