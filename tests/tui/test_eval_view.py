"""[eval]'s samples and numbers as the viewers show them: the dashboard's `v` view at 80×24 and `x`'s
metric cycle, `mt watch --once` and `--headless`; the run's text escaped, never obeyed."""
from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import mt
from tests.tui.synth import SynthRun, complete
from tests.tui.test_app import loaded, make_app, wait_for
from tui.widgets.samples import SamplesScreen

HOSTILE = "\x1b]0;pwned\x07red\nnext line"


def _run(root: Path) -> SynthRun:
    r = SynthRun(root, max_steps=20)
    r.run_start()
    for s in range(1, 21):
        r.step(s)
        if s % 10 == 0:
            r.event("eval", step=s, val_loss=2.0, metrics={"accuracy": s / 20})
            r.event("sample", step=s, index=0, prompt="Once upon", text=f" a time at step {s}", tokens=5)
            r.event("sample", step=s, index=1, prompt="Q:", text=HOSTILE, tokens=9)
    complete(r, 20)
    return r


def test_once_prints_the_newest_samples_and_eval_numbers(tmp_path: Path) -> None:
    r = _run(tmp_path / "run")
    out = mt("watch", r.root, "--once")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "eval @20: accuracy 1" in lines
    at = lines.index("samples @20:")
    assert lines[at + 1] == "  [0] Once upon ▸  a time at step 20"
    assert lines[at + 2] == "  [1] Q: ▸ \\x1b]0;pwned\\x07red⏎next line"   # escaped, one line
    assert "\x1b" not in out.stdout and "step 10" not in out.stdout   # only the newest eval's


def test_headless_prints_each_sample_and_the_eval_numbers(tmp_path: Path) -> None:
    r = _run(tmp_path / "run")
    out = mt("watch", r.root, "--headless")
    assert out.returncode == 0, out.stderr
    assert "eval  step 10  val_loss 2.0000  accuracy 0.5" in out.stdout
    assert "sample  step 10  [0] Once upon ▸  a time at step 10" in out.stdout and "\x1b" not in out.stdout


async def test_v_shows_the_samples_in_80x24_and_x_plots_the_eval_numbers(tmp_path: Path) -> None:
    r = _run(tmp_path / "run")
    app = make_app(r.root)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, SamplesScreen))
        shown = str(app.screen.query_one("#samples-text").render())
        assert "Samples at step 20" in shown and "eval @20: accuracy 1" in shown
        assert "[0] Once upon a time at step 20" in shown and "red\nnext line" in shown and "\x1b" not in shown
        box = app.screen.query_one("#samples").region
        assert box.right <= 80 and box.bottom <= 24   # it fits the terminal
        await pilot.press("v")
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplesScreen))
    app = make_app(r.root)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await pilot.press("x")
        extra = app.query_one("#plot-extra")
        await wait_for(pilot, lambda: extra.display and extra.title.startswith("eval/accuracy"))
        x, y = extra.curves[0].series.arrays()
        assert x.tolist() == [10, 20] and y.tolist() == [0.5, 1.0]


async def test_v_says_how_to_get_samples_when_there_are_none(tmp_path: Path) -> None:
    r = SynthRun(tmp_path / "run")
    r.run_start()
    r.step(1)
    complete(r, 1)
    app = make_app(r.root)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, SamplesScreen))
        assert "[eval] prompts" in str(app.screen.query_one("#samples-text").render())
