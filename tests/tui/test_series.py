"""Smoothing and downsampling: TensorBoard's formula, and spikes that survive any width."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tui.state.plotmath import EmaState, ema_debiased, minmax_downsample
from tui.state.series import Series


def tensorboard_smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's vz_line_chart2 `resmoothDataset`, transcribed literally."""
    last, num_accum, out = 0.0, 0, []
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        num_accum += 1
        debias = 1.0 if weight == 1 else 1 - weight**num_accum
        out.append(last / debias)
    return out


@pytest.mark.parametrize("weight", [0.0, 0.3, 0.6, 0.9, 0.99])
def test_ema_equals_tensorboard(weight):
    rng = random.Random(1)
    vals = [rng.uniform(0, 10) for _ in range(300)]
    vals[17], vals[40] = float("nan"), float("inf")
    got = ema_debiased(vals, weight)
    want = tensorboard_smooth(vals, weight)
    assert np.allclose(got, want, rtol=1e-12, equal_nan=True)
    assert math.isnan(got[17]) and got[40] == float("inf")


def test_ema_first_point_is_the_value_and_incremental_matches_batch():
    assert ema_debiased([4.0, 4.0], 0.6).tolist() == pytest.approx([4.0, 4.0])
    vals = np.linspace(1, 2, 50)
    inc = EmaState(0.6)
    parts = np.concatenate([inc.extend(vals[:20]), inc.extend(vals[20:])])
    assert np.allclose(parts, ema_debiased(vals, 0.6), rtol=1e-14)


@pytest.mark.parametrize("n", [10, 997, 100_000])
def test_single_step_spike_survives_every_width(n):
    x = np.arange(1, n + 1, dtype=float)
    y = np.ones(n)
    spike_at = n * 2 // 3
    y[spike_at] = 50.0
    y[n // 3] = -7.0
    for width in (1, 2, 3, 7, 40, 79, 200, 1000, 5000):
        d = minmax_downsample(x, y, width)
        assert d.ymax.max() == 50.0 and d.ymin.min() == -7.0
        assert len(d.x) <= width
        col = np.flatnonzero(d.ymax == 50.0)[0]
        # the spike is drawn in the column that covers its x
        half = (x[-1] - x[0]) / width / 2
        assert abs(d.x[col] - x[spike_at]) <= half + 1e-9


def test_downsample_marks_nonfinite_columns_and_keeps_finite_extremes():
    x = np.arange(1, 101, dtype=float)
    y = np.linspace(0, 1, 100)
    y[10] = np.nan
    y[80] = np.inf
    d = minmax_downsample(x, y, 10)
    assert len(d.bad_x) == 2
    assert np.all(np.isfinite(d.ymin)) and np.all(np.isfinite(d.ymax))
    xs, ys = d.zigzag()
    assert len(xs) == 20 and all(math.isfinite(v) for v in ys)


def test_series_truncate_and_arrays():
    s = Series()
    s.extend(np.arange(1, 11, dtype=float), np.arange(10, dtype=float))
    s.append(11.0, 10.0)
    s.truncate_after(5)
    x, y = s.arrays()
    assert x.tolist() == [1, 2, 3, 4, 5] and y.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("weight", [0.05, 0.6, 0.999])
def test_blocked_ema_matches_the_loop_across_many_blocks_and_splits(weight):
    rng = np.random.default_rng(3)
    vals = rng.normal(2.0, 1.0, 3000)
    vals[[255, 256, 511, 1999]] = [np.nan, np.inf, -np.inf, np.nan]   # at block edges
    want = tensorboard_smooth(vals.tolist(), weight)
    inc = EmaState(weight)
    got = np.concatenate([inc.extend(vals[:700]), inc.extend(vals[700:701]), inc.extend(vals[701:])])
    assert np.allclose(got, want, rtol=1e-10, atol=0, equal_nan=True)


def test_series_appends_extends_and_truncations_in_any_order_match_a_plain_list():
    rng = np.random.default_rng(3)
    s, ref = Series(), []
    views, checked = [], 0

    def check_views() -> int:   # appends since a view was taken never changed what it shows
        for vx, vy, seen in views:
            assert list(zip(vx.tolist(), vy.tolist())) == seen
        return len(views)

    for _ in range(400):
        op = rng.integers(0, 10)
        if op < 6:                                  # live appends (before and after numpy buffers exist)
            x = (ref[-1][0] + 1) if ref else 0.0
            s.append(x, float(rng.normal()))
            ref.append((x, s.last()))
        elif op < 8:                                # a bulk chunk
            start = (ref[-1][0] + 1) if ref else 0.0
            xs = start + np.arange(int(rng.integers(0, 700)), dtype=float)
            ys = rng.normal(size=xs.size)
            s.extend(xs, ys)
            ref += list(zip(xs.tolist(), ys.tolist()))
        elif op == 8 and ref:                       # a resumed attempt
            cut = ref[int(rng.integers(0, len(ref)))][0]
            checked += check_views()
            s.truncate_after(cut)
            ref = [p for p in ref if p[0] <= cut]
            views = []                              # (later points may reuse the cut-off slots)
        else:
            x, y = s.arrays()
            views.append((x, y, list(zip(x.tolist(), y.tolist()))))
        assert len(s) == len(ref)
    x, y = s.arrays()
    assert list(zip(x.tolist(), y.tolist())) == ref
    assert checked + check_views() > 10
