"""What `mt ls`, `mt watch --once` and the dashboard say about small losses, rolled-back bests,
lost runs and runs no supervisor samples."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mt.ownrun import make_own_run
from tests.cli.conftest import mt
from tests.tui.synth import SynthRun, event_line, write_status
from tests.tui.test_app import loaded, make_app, text_of
from tui.read.bulk import bulk_read

pytestmark = pytest.mark.timeout(120)


def test_a_small_loss_is_printed_as_it_is(tmp_path: Path) -> None:
    r = SynthRun(tmp_path / "runs" / "small", max_steps=4)
    r.run_start()
    for s, loss in enumerate((0.01, 7.456e-05, 0.002), start=1):
        r.step(s, loss=loss)
    r.flush()
    r.status("completed", exit_code=0, ended=r.t)
    ls = mt("ls", tmp_path / "runs")
    assert ls.returncode == 0 and "0.0020  7.456e-05 @2" in ls.stdout, ls.stdout


def rolled_back(root: Path) -> SynthRun:
    """Attempt 1 has 1.0 at step 3, its best (0.5) at step 8 and is killed; attempt 2 resumes from
    step 5, never below 2.1."""
    r = SynthRun(root, max_steps=20)
    r.run_start()
    for s in range(1, 10):
        r.step(s, loss={3: 1.0, 8: 0.5}.get(s, 3.0 - 0.1 * s))
    r.run_start(attempt=2, start_step=5)
    for s in range(6, 9):
        r.step(s, loss=1.5 + 0.1 * s)
    r.flush()
    r.status("stopped", attempt=2, exit_code=0, ended=r.t)
    return r


def test_the_best_loss_after_a_rollback_is_one_of_the_steps_kept(tmp_path: Path) -> None:
    rolled_back(tmp_path / "runs" / "rb")
    ls = mt("ls", tmp_path / "runs")
    assert ls.returncode == 0 and "1.0000 @3" in ls.stdout, ls.stdout
    once = mt("watch", "--once", tmp_path / "runs" / "rb")
    assert "best 1 @3" in once.stdout, once.stdout
    # the bulk read of a big run (its columns in one go) agrees
    st = bulk_read(tmp_path / "runs" / "rb", keep_series=False).state
    assert (st.best_loss, st.best_loss_step) == (1.0, 3)


def test_once_on_a_lost_run_says_lost_with_no_eta(tmp_path: Path) -> None:
    r = SynthRun(tmp_path, max_steps=100)
    r.run_start()
    for s in range(1, 6):
        r.step(s)
    r.flush()
    r.status("running")
    st = json.loads(r.paths.status.read_text())
    st["supervisor_pid"] = 2**22 + 12345           # above pid_max: never a live process
    write_status(r.paths, st)
    once = mt("watch", "--once", tmp_path)
    first = once.stdout.splitlines()[0]
    assert "[lost]" in first and "ETA N/A" in first, once.stdout
    assert "supervisor is gone (state lost)" in once.stdout


async def test_a_run_without_mt_launch_says_why_it_has_no_system_samples(tmp_path: Path) -> None:
    paths = make_own_run(0, 1, "plain", tmp_path)     # what mt.init makes for a plain torchrun
    with open(paths.events, "w") as f:
        f.write(event_line("step", 1_700_000_000.0, partial=True, step=1, loss=2.0) + "\n")
    app = make_app(paths.root)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        system = text_of(app, "#system")
        assert "started without mt launch" in system and "`mt launch`" in system, system
