"""A script's own samples (`run.sample`): sample events the viewers show as the engine's; bad ones refused at the call."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cli.conftest import events, mt

SCRIPT = """
import mt
run = mt.init(runs_dir='runs', max_steps=4)
for step in range(1, 5):
    run.step(step, loss=1.0 / step)
    if step % 2 == 0:
        run.sample("Once upon", f" a time {step}", index=0, tokens=3)
        run.sample("Q:", "x" * 5000, index=1)
try:
    run.sample("Q:", b"bytes")
except TypeError as e:
    print("refused:", e)
run.finish()
"""


def test_run_sample_writes_sample_events_that_once_shows(tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("MT_RUN_DIR", "RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "s.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "refused: run.sample: prompt and text must be strings, got str and bytes" in proc.stdout
    run = next((tmp_path / "runs").iterdir())
    got = events(run, "sample")
    assert [(e["step"], e["index"], e["tokens"]) for e in got] == [(2, 0, 3), (2, 1, None), (4, 0, 3), (4, 1, None)]
    assert got[1]["text"] == "x" * 4000   # cut at SAMPLE_TEXT_MAX
    once = mt("watch", run, "--once")
    assert once.returncode == 0 and "samples @4:" in once.stdout and "  [0] Once upon ▸  a time 4" in once.stdout, once.stdout
