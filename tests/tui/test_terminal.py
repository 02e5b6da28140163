"""End to end in a real terminal: `mt launch` inside tmux, watch it train, checkpoint, quit."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from mt.contract.jsonl import read_events, read_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]
REPO = Path(__file__).resolve().parents[2]


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def wait_screen(session: str, pattern: str, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while True:
        screen = tmux("capture-pane", "-p", "-t", session)
        m = re.search(pattern, screen)
        if m:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"{pattern!r} never appeared; screen:\n{screen}")
        time.sleep(0.3)


def test_mt_launch_shows_progress_checkpoints_and_quits_leaving_the_run(tmp_path):
    from tui.supervise.control import kill_run

    session = f"mt-e2e-{os.getpid()}"
    runs = tmp_path / "runs"
    env_cmd = f"cd {REPO} && {REPO}/.venv/bin/mt launch presets/tiny-cpu.toml --runs-dir {runs}; echo MT-EXIT-$?"
    tmux("new-session", "-d", "-s", session, "-x", "150", "-y", "46", "bash", "--norc", "--noprofile")
    try:
        tmux("send-keys", "-t", session, env_cmd, "Enter")
        first = wait_screen(session, r"RUNNING .*step (\d+)/150", 180)
        wait_screen(session, r"loss \d+\.\d+", 30)
        later = wait_screen(session, r"step (?!" + first.group(1) + r"/)(\d+)/150", 60)
        assert int(later.group(1)) > int(first.group(1))            # the numbers move
        tmux("send-keys", "-t", session, "c")
        saved = wait_screen(session, r"checkpoint saved at step (\d+)", 90)
        tmux("send-keys", "-t", session, "q")
        wait_screen(session, r"MT-EXIT-0", 30)                       # back at the shell
        (run_dir,) = list(runs.iterdir())
        ck = [e for e in read_events(run_dir / "events.jsonl") if e.get("kind") == "checkpoint"]
        assert any(e.get("request_id") and e["step"] == int(saved.group(1)) for e in ck)
        # the run keeps going without a viewer
        n0 = len(read_events(run_dir / "events.jsonl"))
        deadline = time.monotonic() + 60
        while len(read_events(run_dir / "events.jsonl")) <= n0:
            assert time.monotonic() < deadline, "the run stopped when the viewer quit"
            time.sleep(0.5)
        assert (read_json(run_dir / "status.json") or {}).get("state") == "running"
    finally:
        for run_dir in (runs.iterdir() if runs.exists() else []):
            if (read_json(run_dir / "status.json") or {}).get("state") not in ("completed", "killed", "failed", "stopped"):
                kill_run(run_dir, grace_s=2.0)
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
