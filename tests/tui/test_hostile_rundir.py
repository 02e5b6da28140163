"""Run directories no reader may be broken by: numbers at the edge of the float range, JSON nested
past the parser's recursion limit, terminal escape sequences in every text a run holds."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.cli.conftest import mt
from tests.tui.synth import SynthRun
from tests.tui.test_app import loaded, log_text, make_app, text_of
from tests.tui.test_compare import figure
from tests.tui.test_plots import y_labels
from tui.view.compare import CompareApp

pytestmark = pytest.mark.timeout(120)

BIG = 1.7976931348623157e308          # the largest float: the parser takes it as a loss
OSC = "\x1b]0;PWNED\x07"              # sets the terminal's (tmux pane's) title
SHOWN = "\\x1b]0;PWNED\\x07"          # what must reach the terminal instead
NESTED = "[" * 100_000 + "]" * 100_000


def hostile_run(root: Path, sign: float = 1.0) -> Path:
    """A stopped run whose losses are +-BIG and whose every text carries OSC."""
    r = SynthRun(root, name=f"run{OSC}name", max_steps=10)
    r.run_start()
    for s in range(1, 7):
        r.step(s, loss=sign * BIG * (1 if s % 2 else -1), grad_norm=BIG, tokens_per_s=BIG)
    r.event("eval", step=6, val_loss=-BIG)
    r.event("incident", code="nan_loss", severity="error", step=3, title=f"title{OSC}", detail=f"detail{OSC}",
            advice=f"advice{OSC}", evidence={f"key{OSC}": f"value{OSC}"})
    r.event("checkpoint", step=6, path=f"checkpoints/step-6{OSC}", bytes=10, seconds=BIG, reason="interval",
            request_id=None)
    r.event("run_end", step=6, status="stopped", reason=f"reason{OSC}")
    r.flush()
    r.status("stopped", exit_code=0, reason=f"reason{OSC}", ended=r.t)
    (root / "logs").mkdir(exist_ok=True)
    (root / "logs" / "rank0.log").write_text(f"log line{OSC}\n")
    return root


def no_control_bytes(out: str) -> None:
    assert "\x1b" not in out and "\x07" not in out, repr(out)


def test_text_views_print_edge_numbers_and_show_escapes(tmp_path: Path) -> None:
    """`--once`, `--headless`, `mt ls` and `mt diff` on runs of +-1.8e308 losses, OSC in every text and in the
    folder's name: short numbers, the escapes visible, not a byte of them obeyed."""
    runs = tmp_path / "runs"
    a = hostile_run(runs / f"a{OSC}")
    b = hostile_run(runs / "b", sign=-1.0)
    once = mt("watch", "--once", a)
    assert once.returncode == 0, once.stderr
    no_control_bytes(once.stdout)
    for text in ("run", "title", "reason", "checkpoints/step-6"):
        assert f"{text}{SHOWN}" in once.stdout, once.stdout
    assert "loss -1.798e+308" in once.stdout and "tok/s 1.798e+308" in once.stdout
    headless = mt("watch", "--headless", a)
    assert headless.returncode == 0, headless.stderr
    no_control_bytes(headless.stdout)
    assert f"run dir: {runs}/a{SHOWN}" in headless.stdout and f"title{SHOWN}" in headless.stdout, headless.stdout
    ls = mt("ls", runs)
    assert ls.returncode == 0, ls.stderr
    no_control_bytes(ls.stdout)
    assert f"a{SHOWN}" in ls.stdout and "-1.798e+308 @2" in ls.stdout and "1.798e+308 @1" in ls.stdout
    diff = mt("diff", a, b)
    assert diff.returncode == 0, diff.stderr
    no_control_bytes(diff.stdout)
    assert "-1.798e+308" in diff.stdout and "1.798e+308 @1" in diff.stdout
    assert max(map(len, (once.stdout + ls.stdout + diff.stdout).splitlines())) < 200
    missing = mt("watch", "--once", runs / f"gone{OSC}")   # an error line names the path safely too
    assert missing.returncode == 2 and f"gone{SHOWN}: no such run directory" in missing.stderr, missing.stderr
    no_control_bytes(missing.stderr)


async def test_dashboard_draws_edge_numbers_and_shows_escapes(tmp_path: Path) -> None:
    run = hostile_run(tmp_path / "run")
    app = make_app(run)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await pilot.pause(0.3)
        loss = figure(app, "#plot-loss")
        assert not any("cannot draw" in line for line in loss), loss
        assert "1.5e308" in y_labels(loss) and "-1.5e308" in y_labels(loss), loss
        assert not any("cannot draw" in line for line in figure(app, "#plot-grad"))
        shown = {"header": text_of(app, "#header"), "notice": text_of(app, "#notice"),
                 "incident": text_of(app, "#incident-detail"), "logs": log_text(app)}
        for where, text in shown.items():
            no_control_bytes(text)
            assert SHOWN in text, (where, text)
        await pilot.press("l")   # the log axis: 1.8e308 and its band inside the float range
        await pilot.pause(0.3)
        assert not any("cannot draw" in line for line in figure(app, "#plot-grad"))


async def test_compare_view_draws_edge_numbers(tmp_path: Path) -> None:
    a, b = hostile_run(tmp_path / f"a{OSC}"), hostile_run(tmp_path / "b", sign=-1.0)
    app = CompareApp([a, b], poll_s=0.05, redraw_s=0.05)
    async with app.run_test(size=(120, 36)) as pilot:
        for _ in range(100):
            if app.settled():
                break
            await pilot.pause(0.05)
        lines = figure(app, "#compare-loss")
        assert not any("cannot draw" in line for line in lines) and "1.5e308" in y_labels(lines), lines
        legend = str(app.query_one("#compare-legend").content)
        no_control_bytes(legend)
        assert f"a{SHOWN}" in legend


def nested_run(root: Path) -> tuple[Path, dict]:
    """A running run whose status.json, config.json and a system.jsonl line nest past json's limit."""
    r = SynthRun(root, max_steps=10)
    r.run_start()
    for s in range(1, 6):
        r.step(s)
    r.flush()
    r.status("running")
    good = json.loads((root / "status.json").read_text())
    (root / "status.json").write_text(NESTED)
    (root / "system.jsonl").write_text(NESTED + "\n")
    return root, good


def test_nested_json_is_one_bad_file_not_a_crash(tmp_path: Path) -> None:
    run, _ = nested_run(tmp_path / "run")
    other = tmp_path / "other"
    shutil.copytree(run, other)
    once = mt("watch", "--once", run)
    assert once.returncode == 0 and "step 5/10" in once.stdout, once.stdout + once.stderr
    (run / "config.json").write_text(NESTED)
    once = mt("watch", "--once", run)
    assert once.returncode == 0 and "step 5/10" in once.stdout, once.stdout + once.stderr
    diff = mt("diff", run, other)
    assert diff.returncode == 2 and "Traceback" not in diff.stderr, diff.stderr
    assert diff.stderr.strip().splitlines() == [f"mt: {run / 'config.json'}: cannot read the run's config "
                                                "(RecursionError)"], diff.stderr
    # parsed, but deeper than any config: one line too, not a recursion in the comparison
    (run / "config.json").write_text(json.dumps({"train": json.loads("[" * 900 + "]" * 900)}))
    diff = mt("diff", run, other)
    assert diff.returncode == 2 and "nested deeper than 32 levels" in diff.stderr, diff.stderr


async def test_dashboard_opens_on_nested_json(tmp_path: Path) -> None:
    run, _ = nested_run(tmp_path / "run")
    (run / "config.json").write_text(NESTED)
    app = make_app(run)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        assert "step 5/10" in text_of(app, "#header")
        assert os.path.getsize(run / "status.json") == len(NESTED)   # read, never rewritten


async def test_markup_in_a_run_name_is_text_in_the_kill_dialog(tmp_path: Path) -> None:
    """A name like `a[/x]b` is no Textual markup (that one would raise MarkupError)."""
    r = SynthRun(tmp_path, name="a[/x]b[@click=app.quit]q")
    r.run_start()
    r.step(1)
    r.flush()
    r.status("running")
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        assert "a[/x]b[@click=app.quit]q" in text_of(app, "#header")
        await pilot.press("k")
        await pilot.pause(0.2)
        question = app.screen.query_one("#question").render()
        assert "Kill run a[/x]b[@click=app.quit]q?" in str(question), question
        await pilot.press("n")
