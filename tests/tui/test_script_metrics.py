"""A script's own metrics reach every reader (index, scan, cache, live) and the dashboard's `x` key."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.tui.test_app import loaded, make_app, wait_for
from tui.read.bulk import bulk_read

SCRIPTS = Path(__file__).parents[1] / "library" / "scripts"


def _script_run(tmp_path: Path, steps: int = 60) -> Path:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MT_") and k not in ("RANK", "WORLD_SIZE")}
    subprocess.run([sys.executable, str(SCRIPTS / "plain_loop.py"), "--steps", str(steps), "--sleep", "0",
                    "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env, check=True, timeout=60, capture_output=True)
    return next((tmp_path / "runs").iterdir())


def _expected(run: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    lines = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    acc = [(e["step"], e["extra"]["accuracy"]) for e in lines if e["kind"] == "step"]
    val = [(e["step"], e["values"]["val_loss"]) for e in lines if e["kind"] == "metrics"]
    return acc, val


def _points(series) -> list[tuple[int, float]]:
    x, y = series.arrays()
    return list(zip(map(int, x.tolist()), y.tolist()))


def test_extra_metrics_are_read_alike_from_the_index_and_a_scan(tmp_path: Path) -> None:
    run = _script_run(tmp_path)
    acc, val = _expected(run)
    assert len(acc) == 60 and len(val) == 6
    for how in ("index", "scan"):
        if how == "scan":
            (run / "events.idx").unlink()
        res = bulk_read(run)
        assert (res.from_index > 0) == (how == "index"), f"{how}: read without it"
        assert _points(res.series.extra["accuracy"]) == acc, how
        assert _points(res.series.val_loss) == val and res.state.val_loss == val[-1][1], how
        assert res.state.step == 60 and res.state.n_steps == 60 and res.state.max_steps is None, how


async def test_x_cycles_the_scripts_own_metrics_in_place_of_the_learning_rate(tmp_path: Path) -> None:
    run = _script_run(tmp_path)
    acc, _ = _expected(run)
    app = make_app(run)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        lr, extra = app.query_one("#plot-lr"), app.query_one("#plot-extra")
        assert lr.display and not extra.display
        await pilot.press("x")
        await wait_for(pilot, lambda: extra.display and extra.drawn_current())
        assert not lr.display and extra.title.startswith("accuracy")
        assert _points(extra.curves[0].series) == acc
        from tests.tui.test_plots import figure
        assert "accuracy" in figure(app, "#plot-extra")[0]
        await pilot.press("x")  # the only one: back to the learning rate
        assert lr.display and not extra.display


BARE_SCRIPT = """
import sys, mt
run = mt.init(config={}, runs_dir=sys.argv[1])
for step in range(1, 41):
    run.step(step, loss=1.0 / step, accuracy=step / 40, zeta=40 - step)   # no lr, no tokens
run.finish()
"""


def _bare_run(tmp_path: Path) -> Path:
    """A finished run of a script that reports a loss and two metrics of its own, nothing else."""
    script = tmp_path / "bare.py"
    script.write_text(BARE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MT_") and k not in ("RANK", "WORLD_SIZE")}
    subprocess.run([sys.executable, str(script), str(tmp_path / "runs")], cwd=tmp_path, env=env, check=True,
                   timeout=60, capture_output=True)
    return next((tmp_path / "runs").iterdir())


async def test_t_without_token_counts_says_so_rather_than_a_row_of_x(tmp_path: Path) -> None:
    from tests.tui.test_app import screen_text
    app = make_app(_bare_run(tmp_path))
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        lr, tps = app.query_one("#plot-lr"), app.query_one("#plot-tps")
        await wait_for(pilot, lambda: "no learning rate reported" in screen_text(app, "#plot-lr"))
        await pilot.press("t")
        await wait_for(pilot, lambda: tps.display and tps.drawn_current())
        await wait_for(pilot, lambda: "no token counts reported" in screen_text(app, "#plot-tps"))
        assert not lr.display and "xxx" not in screen_text(app, "#plot-tps")


async def test_x_redraws_at_once_on_a_finished_run(tmp_path: Path) -> None:
    from tests.tui.test_app import screen_text
    app = make_app(_bare_run(tmp_path))
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        extra = app.query_one("#plot-extra")
        await pilot.press("x")
        await wait_for(pilot, lambda: "accuracy  (x: next)" in screen_text(app, "#plot-extra"))
        await pilot.press("x")   # the next metric: same number of points, so the same data version
        await wait_for(pilot, lambda: "zeta  (x: next)" in screen_text(app, "#plot-extra"))
        assert extra.title.startswith("zeta") and "accuracy" not in screen_text(app, "#plot-extra")
