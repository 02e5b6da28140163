"""A tqdm progress bar in a rank's log: the logs panel shows each bar's last state, never `\\x0d`
or `\\x1b[A` (the bytes come from a real tqdm process; the lines go through LogTail and LogsPanel)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.tui.synth import SynthRun
from tests.tui.test_app import in_log, loaded, log_text, make_app, wait_for

TQDM_SCRIPT = """
import sys, tqdm
for _ in tqdm.trange(5, desc="single", mininterval=0, file=sys.stderr):
    pass
for _ in tqdm.trange(2, desc="epoch", mininterval=0, file=sys.stderr):
    for _ in tqdm.trange(3, desc="batch", leave=False, mininterval=0, file=sys.stderr):
        pass
print("after the bars", file=sys.stderr, flush=True)
"""


def _run_with_tqdm_log(tmp_path: Path) -> tuple[Path, bytes]:
    r = SynthRun(tmp_path / "run")
    r.run_start()
    for s in range(1, 11):
        r.step(s)
    r.flush()
    r.status("completed")
    log = r.paths.rank_log(0)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as f:
        subprocess.run([sys.executable, "-c", TQDM_SCRIPT], stderr=f, check=True, timeout=60)
    return r.root, log.read_bytes()


async def test_tqdm_bars_show_as_their_last_state(tmp_path: Path) -> None:
    run, raw = _run_with_tqdm_log(tmp_path)
    assert b"\r" in raw and b"\x1b[A" in raw   # what tqdm really wrote: rewrites and cursor moves
    app = make_app(run)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await wait_for(pilot, lambda: in_log(app, "after the bars"))
        shown = log_text(app)
        assert "\\x0d" not in shown and "\\x1b" not in shown and "[A" not in shown, shown
        # the single bar's line is its last state only: 5/5, none of its earlier ones
        assert in_log(app, "single: 100%") and "5/5" in shown and "0/5" not in shown, shown
        assert in_log(app, "epoch: 100%") and "2/2" in shown, shown


LIVE_BAR = """
import pathlib, sys, time, tqdm
go = pathlib.Path(sys.argv[1])
for i in tqdm.trange(5, desc="live", mininterval=0, file=sys.stderr):
    while not (go / str(i)).exists():   # the test says when the bar moves on
        time.sleep(0.02)
print("bar done", file=sys.stderr, flush=True)
"""


@pytest.mark.slow
async def test_a_running_bar_shows_its_current_state_in_one_line(tmp_path: Path) -> None:
    r = SynthRun(tmp_path / "run")
    r.run_start()
    r.step(1)
    r.flush()
    r.status("running")
    log = r.paths.rank_log(0)
    log.parent.mkdir(parents=True, exist_ok=True)
    go = tmp_path / "go"
    go.mkdir()
    app = make_app(r.root)
    with log.open("wb") as f:
        bar = subprocess.Popen([sys.executable, "-c", LIVE_BAR, str(go)], stderr=f)
    try:
        async with app.run_test(size=(140, 44)) as pilot:
            await loaded(pilot)
            await wait_for(pilot, lambda: "0/5" in log_text(app))   # the bar's line is not finished yet
            for i in range(4):
                (go / str(i)).touch()
                # the line is replaced, not added to: the new state in, the old one out
                await wait_for(pilot, lambda: f"{i + 1}/5" in log_text(app) and f"{i}/5" not in log_text(app))
            (go / "4").touch()
            await wait_for(pilot, lambda: in_log(app, "bar done"))
            shown = log_text(app)
            assert shown.count("live:") == 1 and "5/5" in shown and "4/5" not in shown, shown
            assert bar.wait(timeout=30) == 0
    finally:
        bar.kill()
        bar.wait()


async def test_an_unfinished_line_at_opening_is_shown(tmp_path: Path) -> None:
    run, _ = _run_with_tqdm_log(tmp_path)
    log = tmp_path / "run" / "logs" / "rank0.log"
    with log.open("ab") as f:   # a bar that stopped mid-line (the run is over; nothing will end it)
        subprocess.run([sys.executable, "-c", "import sys, tqdm\nb = tqdm.tqdm(total=10, desc='stuck', mininterval=0, file=sys.stderr)\n"
                        "b.update(3)\nb.refresh()\nsys.stderr.flush()\nimport os\nos._exit(0)"], stderr=f, check=True, timeout=60)
    assert not log.read_bytes().endswith(b"\n")
    app = make_app(run)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await wait_for(pilot, lambda: in_log(app, "stuck:  30%") and "3/10" in log_text(app))
        assert "0/10" not in log_text(app) and in_log(app, "after the bars")


def test_a_long_running_bar_keeps_only_its_newest_state(tmp_path: Path) -> None:
    from tui.read.watcher import PARTIAL_MAX, LogTail
    log = tmp_path / "rank0.log"
    with log.open("wb") as f:   # 3,000 states of one bar, never ended by a newline
        subprocess.run([sys.executable, "-c", "import os, sys, tqdm\nb = tqdm.tqdm(total=5000, desc='long', mininterval=0, file=sys.stderr)\n"
                        "for _ in range(3000): b.update(1)\nsys.stderr.flush()\nos._exit(0)"], stderr=f, check=True, timeout=60)
    assert log.stat().st_size > 150_000 > 30 * PARTIAL_MAX   # far more than is kept
    tail = LogTail(log, start_bytes=1 << 30)
    assert tail.poll() == [] and "long:  60%" in tail.pending() and "3000/5000" in tail.pending()
    assert len(tail._lines.partial) <= PARTIAL_MAX   # what is kept of the unfinished line: its newest state
