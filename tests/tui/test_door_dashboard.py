"""The dashboard on a run directory holding FIFOs and a /dev/zero link (issue #34: it hung, q and
Ctrl-C ignored): it loads what is readable and quits on q, because its readers use the door."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tui.synth import SynthRun
from tests.tui.test_app import loaded, make_app, text_of

pytestmark = pytest.mark.timeout(120)


async def test_dashboard_loads_and_quits_beside_fifos_and_dev_zero(tmp_path: Path) -> None:
    r = SynthRun(tmp_path, name="doorrun")
    r.run_start()
    for s in range(1, 6):
        r.step(s)
    r.flush()
    r.status("running")
    run = tmp_path
    (run / "status.json").unlink()
    os.mkfifo(run / "status.json")
    os.mkfifo(run / "system.jsonl")
    os.mkfifo(run / "incidents.jsonl")
    (run / "mirror.json").symlink_to("/dev/zero")
    (run / "heartbeat").mkdir(exist_ok=True)
    os.mkfifo(run / "heartbeat" / "rank0")
    app = make_app(run)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        assert "step 5" in text_of(app, "#header"), text_of(app, "#header")
        await pilot.press("q")
        await pilot.pause(0.2)
    assert not app.is_running
