"""A script's run reads no knobs: a `set` request dropped in its control/ is rejected in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cli.conftest import events, wait_for

LOOP = """
import time
from pathlib import Path
import mt
run = mt.init(runs_dir="runs", name="knobs")
print(run.dir, flush=True)
step = 0
while not Path("go").exists():
    step += 1
    run.step(step, loss=1.0, lr=1e-3)
    time.sleep(0.02)
run.finish()
"""


def test_a_set_request_to_a_script_is_rejected_and_leaves_the_inbox(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(LOOP)
    env = {k: v for k, v in os.environ.items() if k not in ("MT_RUN_DIR", "RANK", "WORLD_SIZE")}
    proc = subprocess.Popen([sys.executable, "loop.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        run_dir = Path(proc.stdout.readline().strip())
        wait_for(lambda: events(run_dir, "step"), 30, "the first step")
        tmp = run_dir / "control" / ".req.json"
        tmp.write_text(json.dumps({"id": "set-1", "action": "set", "t": 1.0, "settings": {"lr_scale": 0.5}}))
        tmp.rename(run_dir / "control" / "set-1.json")
        answer = wait_for(lambda: [e for e in events(run_dir, "control") if e["request_id"] == "set-1"], 30, "the answer")
        (tmp_path / "go").touch()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    assert [(a["status"], a["action"]) for a in answer] == [("rejected", "set")]
    assert "the script reads no knobs" in answer[0]["detail"]
    assert not list((run_dir / "control").glob("*.json")) and (run_dir / "control" / "processed" / "set-1.json").exists()
    assert not events(run_dir, "knob") and events(run_dir, "run_end")[-1]["status"] == "completed"
