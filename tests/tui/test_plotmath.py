"""Axis maths without a terminal: log-y points, tick choices, compact labels."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tui.format.fmt import fmt_compact
from tui.state.plotmath import (
    fit_rows,
    linear_ticks,
    log_points,
    log_ticks,
    plot_scale,
    step_ticks,
    tick_labels,
    tick_row,
    window_slice,
    y_axis,
)
from tui.state.window import XWindow, narrow, next_window, widen, window_range


@pytest.mark.parametrize("v, want", [
    (0, "0"), (1, "1"), (67, "67"), (1234, "1234"), (8259, "8259"), (34_600, "34.6k"), (34_612.3, "34.6k"),
    (999_950, "1M"), (1.5e6, "1.5M"), (2e9, "2G"), (2.5, "2.5"), (0.25, "0.25"), (0.0125, "0.0125"),
    (3e-4, "3e-4"), (2.5e-4, "2.5e-4"), (1e-5, "1e-5"), (-34_600, "-34.6k"), (123.4, "123"),
    (None, "N/A"), (math.inf, "inf"), (1.7976931348623157e308, "1.8e308"), (5e-324, "4.94e-324"),
])
def test_fmt_compact(v, want):
    assert fmt_compact(v) == want


def test_log_points_drop_non_positive_values_and_keep_bad_ones_marked():
    x = np.array([0.0, 1, 2, 3, 4, 5])
    y = np.array([0.0, 10.0, -1.0, math.nan, 1000.0, math.inf])
    lx, ly = log_points(x, y)
    assert lx.tolist() == [1, 3, 4, 5]
    assert ly[0] == 1.0 and math.isnan(ly[1]) and ly[2] == 3.0 and ly[3] == math.inf


@pytest.mark.parametrize("lo, hi, n, want", [
    (1e-5, 1e-3, 4, [1e-5, 1e-4, 1e-3]),                       # decades
    (1e-4, 1e-3, 4, [1e-4, 2e-4, 5e-4, 1e-3]),                 # one decade: 1-2-5
    (1.0, 5.0, 5, [1.0, 2.0, 3.0, 4.0, 5.0]),                  # loss 1..5: every digit
    (2.96, 6.65, 4, [3.0, 4.0, 5.0, 6.0]),
    (8193.0, 8259.0, 3, [8200.0, 8220.0, 8240.0]),             # narrower than a digit: linear
    (1e-8, 1e3, 4, [1e-8, 1e-5, 1e-2, 10.0]),                  # many decades, thinned
])
def test_log_ticks(lo, hi, n, want):
    assert log_ticks(lo, hi, n) == pytest.approx(want)


def test_y_axis_log_ticks_sit_at_log10_of_real_values():
    ax = y_axis(math.log10(1e-5), math.log10(1e-3), 8, logy=True)
    assert ax.labels == ["1e-5", "1e-4", "1e-3"] and ax.ticks == pytest.approx([-5, -4, -3])
    flat = y_axis(0.0, 0.0, 8, logy=True)                       # a flat curve at 1: a decade around it
    assert flat.lo < 0 < flat.hi and "1" in flat.labels


def test_linear_ticks_are_round_and_labelled_distinctly():
    assert linear_ticks(0.0002, 0.003, 4) == [0.001, 0.002, 0.003]
    assert linear_ticks(0.1, 0.35, 3) == [0.1, 0.2, 0.3]         # no 0.30000000000000004
    assert tick_labels([34_550.0, 34_600.0, 34_650.0]) == ["34.55k", "34.6k", "34.65k"]
    ax = y_axis(34_010.0, 34_670.0, 9, logy=False)
    assert all(label.endswith("k") for label in ax.labels) and len(ax.labels) >= 2


@pytest.mark.parametrize("lo, hi, cols", [(1, 67, 27), (1, 67, 74), (1, 150, 27), (0, 12_345, 30),
                                          (1, 1_000_000, 40), (1, 67, 5), (3, 4, 10)])
def test_step_ticks_label_both_ends_with_whole_numbers_that_fit(lo, hi, cols):
    ticks, labels = step_ticks(lo, hi, cols)
    assert ticks[0] == lo and ticks[-1] == hi and ticks == sorted(set(ticks))
    assert all(isinstance(t, int) for t in ticks) and len(labels) == len(ticks)
    # where plotext will put them (centred, pushed inside at the ends): never touching
    spans = []
    for t, label in zip(ticks, labels):
        col = math.floor(0.5 + (cols - 1) * (t - lo) / (hi - lo))
        start = min(max(col - len(label) // 2, 0), cols - len(label) + 1)
        spans.append((start, start + len(label)))
    assert all(b + 1 < c for (_, b), (c, _) in zip(spans, spans[1:]))


def test_step_ticks_of_one_step():
    assert step_ticks(5, 5, 20) == ([5], ["5"])


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13])
@pytest.mark.parametrize("lo, hi, logy", [(0.0, 2.62, False), (0.0, 0.001, False), (2.69, 3.74, False),
                                          (math.log10(1e-5), math.log10(1e-3), True)])
def test_y_ticks_land_on_their_own_rows_ascending(rows, lo, hi, logy):
    ax = y_axis(lo, hi, rows, logy)
    got = [tick_row(t, ax.lo, ax.hi, rows) for t in ax.ticks]
    assert got == sorted(got) and all(0 <= r < rows for r in got)          # bottom to top, on the canvas
    assert len(set(got)) == len(got), (ax.ticks, got)                        # one label a row
    assert len(ax.ticks) >= min(rows, 2) and len(set(ax.labels)) == len(ax.labels)
    steps = np.diff(ax.ticks)
    assert logy or np.allclose(steps, steps[:1]), ax.ticks                     # evenly spaced
    values = [10 ** t if logy else t for t in ax.ticks]
    assert [float(v) for v in ax.labels] == pytest.approx(values, rel=0.05)  # labels say the ticks


def test_fit_rows_drops_the_ticks_that_would_share_a_row():
    assert fit_rows([0.0, 1.0, 2.0, 3.0], 0.0, 3.0, 1) == [0.0]
    assert fit_rows([0.0, 1.0, 2.0, 3.0], 0.0, 3.0, 2) == [0.0, 2.0]       # 1.0 shares row 0, 3.0 row 1
    assert fit_rows([0.0, 1.0, 2.0, 3.0], 0.0, 3.0, 7) == [0.0, 1.0, 2.0, 3.0]


def test_window_cycle_narrow_widen_and_range():
    w = XWindow()
    assert (w.label(), window_range(w, 1, 5000)) == ("all steps", (1, 5000))
    w = next_window(w)
    assert (w.label(), window_range(w, 1, 5000)) == ("last 10%", (pytest.approx(4500.1), 5000))
    w = next_window(w)
    assert (w.label(), window_range(w, 1, 5000)) == ("last 1,000 steps", (4000, 5000))
    assert window_range(w, 1, 300) == (1, 300)                   # shorter than the window: all of it
    assert next_window(w) == XWindow()
    assert narrow(XWindow()) == XWindow("frac", 0.5) and narrow(XWindow("frac", 0.1)).label() == "last 5%"
    assert narrow(XWindow("steps", 1000)) == XWindow("steps", 500)
    assert narrow(XWindow("steps", 15)) == XWindow("steps", 10)   # never narrower than 10 steps
    assert widen(XWindow("frac", 0.1), 5000) == XWindow("frac", 0.2) and widen(XWindow("frac", 0.5), 5000) == XWindow()
    assert widen(XWindow("steps", 1000), 5000) == XWindow("steps", 2000)
    assert widen(XWindow("steps", 4000), 5000) == XWindow()       # as wide as the run: all of it
    assert widen(XWindow(), 5000) == XWindow()
    x = np.arange(1.0, 101.0)
    assert x[window_slice(x, 90.5, 100)].tolist() == list(range(91, 101))


BIG, TINY = 1.7976931348623157e308, 5e-324


@pytest.mark.parametrize("lo, hi, logy", [
    (-BIG, BIG, False), (BIG, BIG, False), (-BIG, -BIG, False), (1e300, 1e300, False), (0.0, BIG, False),
    (math.log10(BIG), math.log10(BIG), True), (math.log10(TINY), math.log10(TINY), True),
    (math.log10(TINY), math.log10(BIG), True),
])
def test_y_axis_at_the_edges_of_the_float_range(lo, hi, logy):
    """Values the event parser accepts: an axis with finite ticks inside it, each labelled."""
    scale = 1.0 if logy else plot_scale(lo, hi)
    ax = y_axis(lo / scale, hi / scale, 20, logy, scale)
    assert ax.ticks and all(ax.lo <= t <= ax.hi for t in ax.ticks) and math.isfinite(ax.hi - ax.lo)
    assert all(math.isfinite(float(label)) for label in ax.labels), ax.labels
    real = [10 ** t if logy else t * scale for t in ax.ticks]
    assert [float(label) for label in ax.labels] == pytest.approx(real, rel=0.05)
