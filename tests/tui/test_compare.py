"""The compare view (`mt watch A B`) on two recorded real runs: one finished, one made live by
appending its recorded events while the view runs."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from tests.tui.conftest import FIXTURES
from tests.tui.test_app import wait_for
from tests.tui.test_plots import axis_names, figure, x_labels
from tui.state.compare import run_color
from tui.view.compare import CompareApp

pytestmark = pytest.mark.timeout(120)

LIVE_UNTIL = 60   # lines of the recorded events.jsonl the live run starts with (run_start + steps)


def live_copy(dest: Path) -> tuple[Path, list[str]]:
    """The recorded cpu_only run cut to its first LIVE_UNTIL lines, status running under a live
    process (this one); returns the dir and the lines still to append."""
    lines = (FIXTURES / "cpu_only" / "events.jsonl").read_text().splitlines(keepends=True)
    dest.mkdir()
    for name in ("config.json", "preset.toml"):
        (dest / name).write_bytes((FIXTURES / "cpu_only" / name).read_bytes())
    (dest / "events.jsonl").write_text("".join(lines[:LIVE_UNTIL]))
    status = json.loads((FIXTURES / "cpu_only" / "status.json").read_text())
    status.update(state="running", supervisor_pid=os.getpid(), ended=None, exit_code=None, reason=None)
    (dest / "status.json").write_text(json.dumps(status))
    return dest, lines[LIVE_UNTIL:]


def finished_copy(dest: Path) -> Path:
    import shutil
    shutil.copytree(FIXTURES / "finished", dest)
    return dest


def cells_by_color(app: CompareApp) -> Counter:
    """Canvas characters per ANSI colour code in the rendered loss plot."""
    out = app.query_one("#compare-loss").render()
    counts: Counter = Counter()
    for span in out.spans:
        style = str(span.style)
        if style.startswith("color("):
            counts[int(style[6:style.index(")")])] += len(out.plain[span.start:span.end].strip())
    return counts


def step_of(events: list[str]) -> int:
    return max(json.loads(line).get("step", 0) for line in events if '"kind":"step"' in line)


async def test_overlay_of_a_finished_and_a_live_run_follows_the_live_one_and_toggles_tokens(tmp_path):
    done = finished_copy(tmp_path / "done-run")
    live, rest = live_copy(tmp_path / "live-run")
    first = (live / "events.jsonl").read_text().splitlines()
    app = CompareApp([done, live], poll_s=0.05, redraw_s=0.05)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, app.settled)
        legend = str(app.query_one("#compare-legend").content)
        rows = {line.split()[1]: line.split() for line in legend.splitlines()[1:3]}
        assert rows["done-run"][2:4] == ["completed", "150/150"]
        assert rows["live-run"][2:4] == ["running", f"{step_of(first)}/150"]
        colors = cells_by_color(app)
        (_, done_c), (_, live_c) = run_color(0), run_color(1)
        swatches = app.query_one("#compare-legend").content
        named = {swatches.plain[sp.start:sp.end].strip(): str(sp.style) for sp in swatches.spans}
        assert named["done-run"] == f"color({done_c})" and named["live-run"] == f"color({live_c})"  # the legend
        assert colors[done_c] > 20 and colors[live_c] > 20, colors   # both curves, each in its colour
        lines = figure(app, "#compare-loss")
        assert x_labels(lines)[-1] == "150" and "step" in axis_names(lines)

        with open(live / "events.jsonl", "a") as f:   # the live run goes on: 40 more recorded steps
            f.write("".join(rest[:40]))
        now = step_of(first + rest[:40])
        await wait_for(pilot, lambda: f"{now}/150" in str(app.query_one("#compare-legend").content))
        await wait_for(pilot, app.settled)
        assert cells_by_color(app)[live_c] > colors[live_c]   # its curve grew

        await pilot.press("x")
        await wait_for(pilot, app.settled)
        lines = figure(app, "#compare-loss")
        assert "tokens seen" in axis_names(lines) and "tokens seen" in lines[0]
        assert x_labels(lines)[-1] == "614k"   # 150 steps x 4,096 tokens (run_start's tokens_per_step)
        assert all(cells_by_color(app)[c] > 20 for c in (done_c, live_c))
        await pilot.press("x")
        await wait_for(pilot, app.settled)
        assert x_labels(figure(app, "#compare-loss"))[-1] == "150"
