"""A tqdm progress bar in a rank's log: the logs panel shows each bar's last state, never `\\x0d`
or `\\x1b[A` (the bytes come from a real tqdm process; the lines go through LogTail and LogsPanel)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
