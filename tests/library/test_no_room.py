"""mt's own writes failing in a script's process (a full disk, a read-only folder): training goes on."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mt.contract.records import Rejected, parse_event
from tests.cli.conftest import events, status, wait_for
from tests.tmpfs import fill, read_only, tmpfs

SCRIPT = """
import sys, time
from pathlib import Path
import mt
out = Path(sys.argv[1])  # the script's own files: not on the full disk
run = mt.init(runs_dir="runs")
for step in range(1, 41):
    if step == 4:
        print("waiting", flush=True)
        while not (out / "go").exists():
            time.sleep(0.05)
    ctl = run.step(step, loss=1.0 / step, lr=1e-3, grad_norm=0.5, tokens=64, acc=step / 40)
    if step % 5 == 0:
        run.log({"val_loss": 2.0 / step}, step=step)
    if step == 10:
        (out / "ck.pt").write_bytes(b"saved")
        run.checkpoint_saved(out / "ck.pt", step)
    time.sleep(0.02)
print("trained", step, flush=True)
if sys.argv[2] == "raise":
    raise ValueError("after training")
run.finish()
"""


def _script(tmp_path: Path, cwd: Path, how: str, **env: str) -> subprocess.Popen[str]:
    (tmp_path / "train.py").write_text(SCRIPT)
    base = {k: v for k, v in os.environ.items() if k not in ("MT_RUN_DIR", "RANK", "WORLD_SIZE", "PYTHONPATH")}
    return subprocess.Popen([sys.executable, str(tmp_path / "train.py"), str(tmp_path), how], cwd=cwd, env={**base, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _said_once(stderr: str) -> str:
    said = [line for line in stderr.splitlines() if line.startswith("mt: ")]
    assert len(said) == 1 and said[0].startswith("mt: cannot write ") and "training goes on" in said[0], stderr
    return said[0]


def _whole_lines(run_dir: Path) -> None:
    data = (run_dir / "events.jsonl").read_bytes()
    assert not data or data.endswith(b"\n"), data[-200:]
    assert [r for r in map(parse_event, data.splitlines()) if isinstance(r, Rejected)] == []


def test_a_disk_that_fills_mid_run_degrades_monitoring_and_the_script_trains_on(tmp_path: Path) -> None:
    with tmpfs("1m") as disk:
        proc = _script(tmp_path, disk, "finish")
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
            run_dir = wait_for(lambda: next(iter((disk / "runs").iterdir()), None), 10, "the run directory")
            wait_for(lambda: len(events(run_dir, "step")) == 3, 10, "the first steps")
            fill(disk)
            (tmp_path / "go").touch()
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 0 and "trained 40" in out, err
        assert "No space left" in _said_once(err)
        _whole_lines(run_dir)  # no torn line: a write that did not fit whole was rolled back
        st = status(run_dir)  # the reserve made room for the final state
        assert st["state"] == "completed" and "mt could not write" in st["reason"], st
        assert [e["status"] for e in events(run_dir, "run_end")] == ["completed"]  # viewers see it end


def test_a_full_disk_at_start_never_maps_unbacked_pages_nor_breaks_the_exception_hook(tmp_path: Path) -> None:
    with tmpfs("1m") as disk:
        run_dir = disk / "run"
        for sub in ("heartbeat", "control", "logs"):
            (run_dir / sub).mkdir(parents=True)
        fill(disk)
        (tmp_path / "go").touch()
        proc = _script(tmp_path, tmp_path, "raise", MT_RUN_DIR=str(run_dir), MT_ATTEMPT="1")
        out, err = proc.communicate(timeout=60)
        # not SIGBUS (-7) from a heartbeat page with no room behind it, nor an OSError from a step
        assert proc.returncode == 1 and "trained 40" in out, err
        assert "ValueError: after training" in err and "Error in sys.excepthook" not in err, err
        assert "heartbeat/rank0" in _said_once(err)
        _whole_lines(run_dir)


def test_a_read_only_folder_under_plain_python_trains_unwatched(tmp_path: Path) -> None:
    with tmpfs("1m") as disk:
        read_only(disk)
        (tmp_path / "go").touch()
        proc = _script(tmp_path, disk, "finish")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "trained 40" in out, err
        assert "Read-only file system" in _said_once(err)
        assert list(disk.iterdir()) == []
