"""Layouts by terminal size, tabs in small terminals, and the x window (zoom) on a live run."""
from __future__ import annotations

import json

import pytest

from tests.tui.synth import SynthRun
from tests.tui.test_app import loaded, make_app, screen_text, text_of, wait_for
from tests.tui.test_plots import figure, value, x_labels, y_labels
from tui.state.layout import Tabs, choose_layout, strip_items
from tui.widgets.dialogs import HelpScreen

pytestmark = pytest.mark.timeout(120)

PLOTS = ("#plot-loss", "#plot-lr", "#plot-grad")
SIZES = {(80, 24): "tabs", (100, 30): "side-tabs", (120, 40): "full", (160, 48): "full", (200, 60): "full",
         (50, 12): "too-small"}


@pytest.mark.parametrize("size, want", [*SIZES.items(), ((59, 40), "too-small"), ((99, 60), "tabs"),
                                        ((200, 27), "tabs"), ((119, 60), "side-tabs"), ((200, 35), "side-tabs")])
def test_choose_layout(size, want):
    assert choose_layout(*size) == want


def test_tabs_switch_within_their_layout():
    t = Tabs()
    assert t.active("tabs") == 1 and t.active("side-tabs") == 2 and t.active("full") is None
    assert [t := t.next("tabs") for _ in range(5)][-1].tabs == 1                 # 1 2 3 4 5, round
    assert Tabs().select("tabs", 5).tabs == 5 and Tabs().select("side-tabs", 1) == Tabs()   # plots stay
    assert Tabs().select("side-tabs", 4).next("side-tabs").side == 2
    assert Tabs().next("full") == Tabs()
    assert strip_items("side-tabs", 3, 2) == [("2 system", False), ("3 incidents (2 open)", True),
                                              ("4 logs", False)]
    assert strip_items("full", None, 0) == []


NVML_ERROR = ("NVMLError_DriverNotLoaded: Driver Not Loaded (the nvidia kernel module is not loaded on this "
              "host: see dmesg, then nvidia-smi)")


def live_run(root) -> SynthRun:
    """A running run with one step written, and a system sample of a host without its GPU driver."""
    r = SynthRun(root, max_steps=10_000)
    r.run_start()
    r.step(1)
    r.flush()
    r.status("running")
    sample = {"v": 1, "t": r.t, "nvml": False, "nvml_error": NVML_ERROR, "gpus": [],
              "ranks": [{"rank": 0, "pid": 1, "cpu_pct": 50.0, "rss_bytes": 2**30, "alive": True}],
              "host": {"cpu_pct": 50.0, "mem_used_bytes": 2**33, "mem_total_bytes": 2**35, "load1": 1.0}}
    r.paths.system.write_text(json.dumps(sample) + "\n")
    return r


def one_line_nvml_error(app) -> None:
    """The system panel says the NVML error on one line, cut with …, the next reading under it."""
    rows = screen_text(app, "#system").splitlines()
    i = next(i for i, row in enumerate(rows) if "GPUs: none (NVMLError_DriverNotLoaded" in row)
    assert rows[i].rstrip(" │").endswith("…") and "rank0" in rows[i + 1], rows


def append_steps(r, first: int, last: int) -> None:
    with open(r.paths.events, "a") as f:
        for s in range(first, last + 1):
            r.step(s)
            f.write(r.lines[-1] + "\n")


async def steady(pilot, cond, timeout: float = 15.0) -> None:
    """cond() holds three checks in a row: a resize or a key is laid out and drawn, also on a
    loaded machine (one check may come between the layout and the redraw)."""
    streak = 0
    for _ in range(int(timeout / 0.05)):
        streak = streak + 1 if cond() else 0
        if streak >= 3:
            return
        await pilot.pause(0.05)
    raise AssertionError("condition not met in time")


def readable(app, sel: str) -> None:
    """A plot's axes: y labels are numbers going up the screen, x labels whole steps going right."""
    lines = figure(app, sel)
    ys = [value(v) for v in y_labels(lines)]
    xs = [int(x) for x in x_labels(lines)]
    assert len(ys) >= 2 and ys == sorted(ys, reverse=True) and len(set(ys)) == len(ys), (sel, lines)
    assert xs == sorted(set(xs)), (sel, lines)


async def test_a_live_run_through_every_terminal_size(tmp_path):
    """Steps keep coming while the terminal goes from 80×24 to 200×60 and below the minimum:
    each size gets its layout, every shown plot and panel is big enough to read."""
    r = live_run(tmp_path)
    app = make_app(tmp_path)
    step = 1
    async with app.run_test(size=(120, 40)) as pilot:   # every size below is a resize
        await loaded(pilot)
        for size, want in SIZES.items():
            append_steps(r, step + 1, step + 30)
            step += 30
            await wait_for(pilot, lambda: f"step {step:,}/" in text_of(app, "#header"))
            await pilot.resize_terminal(*size)   # a resize redraws at once, with the newest steps
            await steady(pilot, lambda: app.dashboard.layout_name == want and app.settled())
            assert app.dashboard.layout_name == want and app.screen.has_class(want), size
            if want == "too-small":
                assert "too small" in text_of(app, "#too-small")
                continue
            loss = app.query_one("#plot-loss")
            assert loss.size.height >= (12 if size == (80, 24) else 10) and loss.size.width >= 50, size
            for p in app.dashboard._shown_plots():
                assert p.size.height >= 7 and p.size.width >= 24, (size, p.id, p.size)
                readable(app, f"#{p.id}")
            assert x_labels(figure(app, "#plot-loss"))[-1] == str(step)      # following the run
            for sel in ("#system", "#incidents", "#logs"):
                w = app.query_one(sel)
                shown = all(a.display for a in w.ancestors_with_self if hasattr(a, "display"))
                assert shown == (want == "full" or (want == "side-tabs" and sel == "#system")), (size, sel)
                if shown:
                    assert w.size.width >= 40 and w.size.height >= (4 if sel == "#system" else 5), (size, sel, w.size)
                if shown and sel == "#system":
                    one_line_nvml_error(app)
            if want == "tabs":   # the other panes are tabs: 2 shows the system panel in place of the loss
                await pilot.press("2")
                await steady(pilot, lambda: app.focused is app.query_one("#system"))
                assert not app.query_one("#plots").display and app.query_one("#system").size.width >= 70
                one_line_nvml_error(app)
                for n, sel in ((3, "#incidents"), (4, "#logs"), (5, "#plots-small"), (1, "#plot-loss")):
                    await pilot.press("tab")
                    await steady(pilot, lambda: app.dashboard.tabs.tabs == n and app.query_one(sel).display)
                    assert f" {n} " in str(app.query_one("#tabstrip").content)
                    if n == 5:
                        await steady(pilot, app.settled)
                        assert {p.id for p in app.dashboard._shown_plots()} == {"plot-lr", "plot-grad"}
                        assert app.focused in app.dashboard._shown_plots()
                        for p in app.dashboard._shown_plots():
                            assert p.size.height >= 12
                            # the tab is the pane: no border of a plot's own, focused or not (one
                            # round the focused plot read as the pane's, the other plot outside it)
                            assert p.size == p.region.size, (p.id, p.size, p.region)
                            readable(app, f"#{p.id}")
        await pilot.press("question_mark")   # resizing under a dialog lays out the main screen
        await pilot.resize_terminal(80, 24)
        await steady(pilot, lambda: app.screen_stack[0].has_class("tabs"))
        assert isinstance(app.screen, HelpScreen)
        box = app.screen.query_one("#help")          # longer than 24 rows: it scrolls to its end

        def help_shown() -> str:
            return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())

        assert box.max_scroll_y > 0 and "closes this help" not in help_shown()
        await pilot.press("end")
        await wait_for(pilot, lambda: "closes this help" in help_shown())
        assert app.is_running


async def test_w_brackets_change_the_window_and_follow_a_live_run(tmp_path):
    r = live_run(tmp_path)
    append_steps(r, 2, 2000)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)

        async def window(keys: str, first: int, last: int, label: str) -> None:
            await wait_for(pilot, lambda: f"step {last:,}/" in text_of(app, "#header"))
            await pilot.press(*keys)   # a key redraws at once, with the newest steps

            def drawn(sel: str) -> bool:
                lines = figure(app, sel)
                xs = x_labels(lines)
                return (int(xs[0]), int(xs[-1])) == (first, last) and (label in lines[0] or label == "all steps")

            await steady(pilot, lambda: app.settled() and all(drawn(sel) for sel in PLOTS))
            assert f"window {label}" in text_of(app, "#header")

        await window("", 1, 2000, "all steps")
        await window("w", 1801, 2000, "last 10%")
        append_steps(r, 2001, 2500)                   # the window's right edge follows the newest step
        await window("", 2251, 2500, "last 10%")
        await window("[", 2376, 2500, "last 5%")
        await window("]", 2251, 2500, "last 10%")
        await window("w", 1500, 2500, "last 1,000 steps")
        append_steps(r, 2501, 2600)
        await window("[", 2100, 2600, "last 500 steps")
        await window("]]]", 1, 2600, "all steps")     # 1,000, 2,000 steps, then all of a 2,599-step run
        await window("w", 2341, 2600, "last 10%")
