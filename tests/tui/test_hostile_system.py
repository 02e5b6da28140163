"""No line of system.jsonl may crash a reader: the dashboard, the incident rules, the viewer process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from mt.contract.system import clean_sample
from tests.tui.synth import finished_run
from tests.tui.test_app import loaded, make_app, text_of

T = 1_800_000_000.0
HOSTILE = [
    {"ranks": 5}, {"gpus": "x", "t": T + 1}, {"t": T + 1, "gpus": [{"index": "0", "util_pct": 3}]},
    {"t": T + 1, "ranks": [{"rank": 0, "cpu_pct": "hot", "rss_bytes": [1]}], "host": 7},
    {"t": "now"}, {"t": 1e400}, {"t": 1.0, "gpus": []}, [1, 2], "text", None, 12,
    {"t": T + 2, "gpus": [{"index": True, "mem_used_bytes": 10**40}], "host": {"load1": {"a": 1}}},
]
GOOD = {"v": 1, "t": T + 3, "nvml": False, "nvml_error": "no driver", "gpus": [],
        "ranks": [{"rank": 0, "pid": 5, "cpu_pct": 87.0, "rss_bytes": 2**30, "alive": True}],
        "host": {"cpu_pct": 50.0, "mem_used_bytes": 2**33, "mem_total_bytes": 2**34, "load1": 1.5}}


def write_hostile(run_dir) -> None:
    with open(run_dir / "system.jsonl", "w") as f:
        for rec in HOSTILE:
            f.write(json.dumps(rec) + "\n")
        f.write(json.dumps(GOOD) + "\n")


def test_clean_sample_types_every_field():
    for raw in HOSTILE:
        s = clean_sample(raw)
        if s is None:
            continue
        assert isinstance(s["t"], float) and isinstance(s["gpus"], list) and isinstance(s["ranks"], list)
        for r in s["ranks"]:
            assert isinstance(r["rank"], int) and r["cpu_pct"] is None and r["rss_bytes"] is None
        assert all(isinstance(g["index"], int) and not isinstance(g["index"], bool) for g in s["gpus"])
        assert all(v is None for v in s["host"].values()) or s is None
    assert clean_sample(GOOD) == GOOD
    assert clean_sample({**GOOD, "t": 1.0}) is None     # 1970: not a time a sample was taken


async def test_dashboard_survives_hostile_system_lines(tmp_path):
    finished_run(tmp_path)
    write_hostile(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        system = text_of(app, "#system")
        assert "rank0" in system and "87%" in system and "16.0 GiB" in system


def test_incident_rules_survive_hostile_system_lines(tmp_path):
    from mt.contract.config import MonitorConfig
    from tui.diagnose.monitor import IncidentMonitor

    finished_run(tmp_path)
    write_hostile(tmp_path)
    monitor = IncidentMonitor(tmp_path, MonitorConfig())
    monitor.poll()
    assert [s["t"] - T for s in monitor.memory.system] == [1.0, 1.0, 1.0, 2.0, 3.0]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_viewer_in_a_terminal_survives_hostile_lines_and_a_crash_exits_non_zero(tmp_path):
    from tests.tui.test_terminal import REPO, tmux, wait_screen

    finished_run(tmp_path / "run")
    write_hostile(tmp_path / "run")
    session = f"mt-sys-{os.getpid()}"
    crash = tmp_path / "crash.py"
    crash.write_text("import sys\nimport tui.view.app as a\n"
                     "def boom(self): raise RuntimeError('boom in mount')\n"
                     "a.MtApp.on_mount = boom\nsys.exit(a.run_app(sys.argv[1]))\n")
    tmux("new-session", "-d", "-s", session, "-x", "140", "-y", "44", "bash", "--norc", "--noprofile")
    try:
        tmux("send-keys", "-t", session, f"cd {REPO} && .venv/bin/mt watch {tmp_path / 'run'}; echo WATCH-EXIT-$?", "Enter")
        wait_screen(session, r"rank0 +cpu +87%", 60)
        tmux("send-keys", "-t", session, "q")
        wait_screen(session, r"WATCH-EXIT-0", 30)
        tmux("send-keys", "-t", session, "clear", "Enter")
        tmux("send-keys", "-t", session, f"{sys.executable} {crash} {tmp_path / 'run'}; echo CRASH-EXIT-$?", "Enter")
        wait_screen(session, r"CRASH-EXIT-1", 60)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
