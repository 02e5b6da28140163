"""Pilot tests of the plots on synthetic runs: what the rendered figures say, read off their text."""
from __future__ import annotations

import re
import time

import pytest

from tests.tui.synth import SynthRun, loss_at
from tests.tui.test_app import loaded, make_app, running_run, wait_for

pytestmark = pytest.mark.timeout(120)

PLOTS = ("#plot-loss", "#plot-lr", "#plot-tps", "#plot-grad")
SUFFIX = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def figure(app, selector: str) -> list[str]:
    """The plot's figure as lines of plain text, as it is on the screen."""
    out = app.query_one(selector).render()
    return out.plain.splitlines() if hasattr(out, "plain") else str(out).splitlines()


def y_labels(lines: list[str]) -> list[str]:
    """The y tick labels, top to bottom (a label then the axis' tick mark)."""
    return [m[1] for line in lines if (m := re.match(r"^\s*([^\s┤├│]+)[┤├]", line))]


def x_labels(lines: list[str]) -> list[str]:
    """The x tick labels: the row under the bottom axis."""
    i = next(i for i, line in enumerate(lines) if "└" in line)
    return lines[i + 1].split()


def axis_names(lines: list[str]) -> str:
    return lines[-1]


def value(label: str) -> float:
    """A compact tick label (34.6k, 3e-4, 1M) as a number."""
    return float(label[:-1]) * SUFFIX[label[-1]] if label[-1] in SUFFIX else float(label)


def canvas(lines: list[str]) -> str:
    """The rows between the top and the bottom axis."""
    top = next(i for i, line in enumerate(lines) if "┌" in line)
    bottom = next(i for i, line in enumerate(lines) if "└" in line)
    return "\n".join(lines[top + 1:bottom])


def curve_cells(lines: list[str]) -> int:
    """Cells of the canvas holding a curve (braille or dot markers)."""
    return sum(1 for ch in canvas(lines) if 0x2801 <= ord(ch) <= 0x28FF or ch == "•")


def shown(app) -> list[str]:
    return [sel for sel in PLOTS if app.query_one(sel).display]


def log_run(root) -> SynthRun:
    """A completed 67-step run from step 0 (lr 0 there), one loss of 0 at step 30."""
    r = SynthRun(root, max_steps=67)
    r.run_start()
    for s in range(0, 68):
        r.step(s, loss=0.0 if s == 30 else None)
        if s % 25 == 0 and s:
            r.event("eval", step=s, val_loss=loss_at(s) + 0.1)
    r.event("run_end", step=67, status="completed", reason="max_steps reached")
    r.flush()
    r.status("completed", exit_code=0, ended=r.t)
    return r


async def test_log_y_draws_every_plot_with_ticks_in_the_data_range(tmp_path):
    log_run(tmp_path)
    app = make_app(tmp_path)
    series = app.watcher.follower.series
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await pilot.press("l")
        await wait_for(pilot, app.settled)
        checked = []
        for _ in range(2):                      # the learning rate, then tokens/s in its place
            for sel in shown(app):
                lines = figure(app, sel)
                text = "\n".join(lines)
                assert "cannot draw" not in text, (sel, text)
                assert curve_cells(lines) >= 20, (sel, text)
                assert "(log)" in axis_names(lines), (sel, text)
                # the ticks are real values inside what the plot holds (positive values only:
                # lr 0 at step 0 and the loss of 0 at step 30 are left out, not stretching the axis)
                ys = {"#plot-loss": [series.loss, series.val_loss], "#plot-lr": [series.lr],
                      "#plot-tps": [series.tokens_per_s], "#plot-grad": [series.grad_norm]}[sel]
                pos = [v for s in ys for v in s.arrays()[1].tolist() if v > 0]
                lo, hi = min(pos), max(pos + ([1.0] if sel == "#plot-grad" else []))   # + the clip line
                labels = [value(v) for v in y_labels(lines)]
                assert len(labels) >= 2, (sel, text)
                assert all(lo * 0.999 <= v <= hi * 1.001 for v in labels), (sel, labels, lo, hi)
                assert "x" not in canvas(lines), (sel, text)   # dropped, not marked as bad points
                checked.append(sel)
            await pilot.press("t")
            await wait_for(pilot, app.settled)
        assert sorted(set(checked)) == sorted(PLOTS)
        # loss 2.9..6.7 on a log axis: whole numbers; lr 1e-4..1e-3: powers of ten
        assert y_labels(figure(app, "#plot-loss")) == ["6", "5", "4", "3"]
        assert {"1e-3", "1e-4"} <= set(y_labels(figure(app, "#plot-lr")))


async def test_finished_run_plots_end_at_its_last_step_with_readable_ticks(tmp_path):
    r = SynthRun(tmp_path, max_steps=67)
    r.run_start()
    for s in range(1, 68):
        r.step(s, tokens_per_s=34_000.0 + 10 * s)
    r.event("run_end", step=67, status="completed", reason="max_steps reached")
    r.flush()
    r.status("completed", exit_code=0, ended=r.t)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await wait_for(pilot, app.settled)
        assert "step 67/67" in str(app.query_one("#header").content)
        checked_tps = False
        for _ in range(2):
            for sel in shown(app):
                lines = figure(app, sel)
                xs = x_labels(lines)
                assert xs[0] == "1" and xs[-1] == "67", (sel, xs)      # the last step is labelled
                assert all(re.fullmatch(r"\d+", x) for x in xs), (sel, xs)   # steps are whole
                assert [int(x) for x in xs] == sorted(int(x) for x in xs)
                assert "step" in axis_names(lines)
                if sel == "#plot-tps":   # 34,010..34,670 tokens/s: 34.2k, 34.4k...
                    labels = y_labels(lines)
                    assert len(labels) >= 2 and all(re.fullmatch(r"34\.\d+k", v) for v in labels), labels
                    assert axis_names(lines).startswith("tokens/s")
                    checked_tps = True
            await pilot.press("t")
            await wait_for(pilot, app.settled)
        assert checked_tps


async def test_plots_catch_up_once_a_live_run_goes_quiet(tmp_path):
    """Steps that arrive within the redraw spacing are drawn as soon as no more come."""
    r = running_run(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await wait_for(pilot, app.settled)
        plots = [app.query_one(sel) for sel in shown(app)]
        # the spacing this test runs inside: the plots would wait 2 s after their last draw
        assert app.dashboard.pacing.min_interval_s >= 2.0
        with open(r.paths.events, "a") as f:
            for s in range(2, 68):
                r.step(s)
                f.write(r.lines[-1] + "\n")
        await wait_for(pilot, lambda: "step 67/" in str(app.query_one("#header").content))
        await wait_for(pilot, lambda: all(p.drawn_current() for p in plots), timeout=2.5)
        for p in plots:
            assert x_labels(figure(app, f"#{p.id}"))[-1] == "67"


async def test_every_plot_shows_the_same_newest_step_while_a_run_streams(tmp_path):
    """Plots redraw together: none lags another (the small ones used to wait twice as long)."""
    r = running_run(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await wait_for(pilot, app.settled)
        sels = shown(app)
        assert len(sels) >= 3
        seen: list[list[str]] = []
        written: dict[int, float] = {}
        late: list[tuple[int, int, float]] = []
        with open(r.paths.events, "a") as f:
            for s in range(2, 150):  # ~20 steps a second for 7 s: never quiet long enough to catch up
                r.step(s)
                f.write(r.lines[-1] + "\n")
                f.flush()
                written[s] = time.monotonic()
                await pilot.pause(0.05)
                labels = [x_labels(figure(app, sel))[-1] for sel in sels]
                seen.append(labels)
                # the newest drawn step is at most one redraw spacing (and a frame) old; the spacing
                # grows with what the builds cost on this machine
                plots = [app.query_one(sel) for sel in sels]
                allowed = app.dashboard.pacing.interval(sum(p.build_s for p in plots)) + 1.0
                if labels[0] != "1" and time.monotonic() - written.get(int(labels[0]) + 1, time.monotonic()) > allowed:
                    late.append((s, int(labels[0]), allowed))
        await wait_for(pilot, lambda: "step 149/" in str(app.query_one("#header").content))
    drawn = [int(labels[0]) for labels in seen]
    assert all(len(set(labels)) == 1 for labels in seen), [labels for labels in seen if len(set(labels)) > 1][:3]
    assert len(set(drawn)) >= 3, drawn      # they did redraw while points kept coming
    assert not late, late[:5]


async def test_no_data_yet_and_a_single_step(tmp_path):
    r = SynthRun(tmp_path)
    r.run_start()
    r.flush()
    r.status("running")
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await wait_for(pilot, app.settled)
        assert "no data yet" in "\n".join(figure(app, "#plot-loss"))
        with open(r.paths.events, "a") as f:
            r.step(1)
            f.write(r.lines[-1] + "\n")
        await wait_for(pilot, lambda: "step 1/" in str(app.query_one("#header").content))
        await wait_for(pilot, app.settled)
        for logy in (False, True):
            lines = figure(app, "#plot-loss")
            assert "cannot draw" not in "\n".join(lines) and x_labels(lines) == ["1"]
            assert curve_cells(lines) >= 1
            await pilot.press("l")
            await wait_for(pilot, app.settled)


def test_a_window_fits_y_to_its_steps_keeps_its_spikes_and_smooths_the_whole_series():
    """Drawn without a terminal: 5,000 steps, a spike of 100 at step 50 (outside the last 1,000
    steps) and one of 9 at step 4,500 (inside)."""
    import numpy as np

    from tui.state.plotmath import ema_debiased
    from tui.state.series import Series
    from tui.state.window import XWindow
    from tui.widgets.curve import Curve
    from tui.widgets.figure import draw, in_window, new_plot

    s = Series()
    for i in range(1, 5001):
        s.append(i, 100.0 if i == 50 else 9.0 if i == 4500 else loss_at(i))
    curves = [Curve("train", s, "cyan")]
    win = XWindow("steps", 1000)
    (shown,), xr = in_window(curves, 0.6, False, win)
    assert xr == (4000, 5000) and shown.x[0] == 4000 and shown.x[-1] == 5000
    whole = ema_debiased(s.arrays()[1], 0.6)
    assert np.array_equal(shown.smooth_y, whole[3999:])          # not restarted at step 4,000
    plt = new_plot()
    draw(plt, "loss", "loss", curves, 80, 20, 0.6, False, None, win)
    plt.plotsize(80, 20)
    plt._set_size(80, 20)
    lines = re.sub(r"\x1b\[[0-9;]*m", "", plt.build()).splitlines()
    assert "last 1,000 steps (steps 4,000–5,000)" in lines[0]
    labels = [value(v) for v in y_labels(lines)]
    assert max(labels) <= 9.0 and max(labels) >= 5        # fitted to 1.2..9, not to the spike of 100
    assert x_labels(lines)[0] == "4000" and x_labels(lines)[-1] == "5000"
    top = canvas(lines).splitlines()[0]                        # the spike of 9 reaches the top row
    assert any(0x2801 <= ord(ch) <= 0x28FF for ch in top), "\n".join(lines)


def test_rollback_and_knob_marks_are_vertical_lines_at_their_steps_in_the_window():
    """RunSeries.marks drawn as a curve with vertical=True: a full-height line at each mark inside
    the x range, in its kind's colour; none outside it, and the y range stays the data's."""
    from tui.state.runseries import MARK_KNOB, MARK_ROLLBACK
    from tui.state.series import Series
    from tui.state.window import XWindow
    from tui.widgets.curve import Curve
    from tui.widgets.figure import draw, new_plot

    s, marks = Series(), Series()
    for i in range(1, 201):
        s.append(i, loss_at(i))
    for x, kind in ((20, MARK_ROLLBACK), (100, MARK_KNOB), (150, MARK_ROLLBACK)):
        marks.append(x, kind)

    def rendered(curves: list, win: XWindow) -> list[str]:
        plt = new_plot()
        draw(plt, "loss", "loss", curves, 80, 20, 0.6, False, None, win)
        plt.plotsize(80, 20)
        plt._set_size(80, 20)
        return plt.build().splitlines()

    def full_columns(lines: list[str]) -> set[int]:
        """Canvas columns filled top to bottom (the frame's own included)."""
        rows = canvas([re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]).splitlines()
        return {c for c in range(min(map(len, rows))) if all(row[c] != " " for row in rows)}

    plain = rendered([Curve("train", s, "cyan")], XWindow())
    marked = rendered([Curve("train", s, "cyan"), Curve("marks", marks, "red", vertical=True)], XWindow())
    strip = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in marked]
    assert y_labels(strip) == y_labels([re.sub(r"\x1b\[[0-9;]*m", "", line) for line in plain])
    assert len(full_columns(marked) - full_columns(plain)) == 3, "\n".join(strip)  # one line per mark
    last = rendered([Curve("train", s, "cyan"), Curve("marks", marks, "red", vertical=True)], XWindow("steps", 80))
    plain_last = rendered([Curve("train", s, "cyan")], XWindow("steps", 80))
    assert len(full_columns(last) - full_columns(plain_last)) == 1  # steps 120..200: only step 150's


def test_the_marks_come_from_rollback_and_knob_events_and_a_new_attempt_drops_those_after_its_start():
    from mt.contract.events import dumps
    from mt.contract.records import parse_event
    from tui.state.runseries import MARK_KNOB, MARK_ROLLBACK, RunSeries

    def ev(kind: str, **fields):
        return parse_event(dumps({"v": 1, "t": 1.8e9, "kind": kind, **fields}))

    series = RunSeries()
    series.add_event(ev("knob", step=30, key="lr_scale", value=0.5, previous=1.0, by="user", request=None))
    series.add_event(ev("knob", step=70, key="grad_clip", value=0.5, previous=1.0, by="user", request=None))
    series.add_event(ev("run_start", **{f: None for f in ("run_id", "config", "resumed_from", "torch_version", "git_commit",
                                                         "device", "backend", "precision")},
                        attempt=2, world_size=1, nnodes=1, params_total=1, tokens_per_step=1, effective_batch=1,
                        static_mem_bytes=1, params_trainable=1, start_step=40, max_steps=100))
    series.add_event(ev("rollback", step=75, to_step=40, skip_batches=35, lr_scale=1.0, why="x", by="user", count=1))
    assert [a.tolist() for a in series.marks.arrays()] == [[30.0, 40.0], [MARK_KNOB, MARK_ROLLBACK]]
