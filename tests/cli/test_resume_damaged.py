"""`mt resume` onto a changed model (refused, naming the keys), past a structurally bad newest
checkpoint, and when no checkpoint is intact (one line, exit 2, nothing started or deleted;
--from-scratch starts again from step 0)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.cli.conftest import events, mt, run_dir_from, status, wait_for, write_preset

pytestmark = pytest.mark.slow


def test_resume_with_every_checkpoint_damaged(tmp_path: Path, runs: Path) -> None:
    # one rank (no torchrun: quick), checkpoints at 2, 4, 6, an injected crash at 7: a failed run
    preset = write_preset(tmp_path / "p.toml", runs, launch={"nproc_per_node": 1},
                          train={"max_steps": 8, "warmup_steps": 1}, checkpoint={"every_steps": 2, "keep_last": 3},
                          faults={"crash_at_step": 7})
    first = mt("launch", preset, "--headless")
    run_dir = run_dir_from(first.stdout)
    assert status(run_dir)["state"] == "failed", first.stdout + first.stderr
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-2", "step-4", "step-6"]

    # a newer step-8 whose manifest lists a FIFO (once a hang holding the run lock): `mt resume`
    # and the engine pass over it to step-6
    bad = Path(shutil.copytree(ckpts / "step-6", ckpts / "step-8"))
    (bad / "model.pt").unlink()
    os.mkfifo(bad / "model.pt")
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["files"]["model.pt"]["bytes"] = 0
    (bad / "manifest.json").write_text(json.dumps(manifest))
    # the [model] changed since the checkpoints: refused, naming the first missing key and misfit
    cfg_path = run_dir / "config.json"
    original = cfg_path.read_text()
    cfg = json.loads(original)
    cfg["model"].update(n_layer=2, d_model=64)
    cfg_path.write_text(json.dumps(cfg))
    res = mt("resume", run_dir, "--headless", timeout=120)
    reason = status(run_dir)["reason"]
    assert res.returncode == 1 and status(run_dir)["attempt"] == 2, res.stdout + res.stderr
    assert reason.startswith(f"resume refused: {ckpts / 'step-6'} does not fit the model: missing key 'blocks.1."), reason
    assert "shape mismatch for " in reason and "[64" in reason and "in the checkpoint" in reason
    [skip8] = [e for e in events(run_dir, "incident") if e["code"] == "checkpoint_skipped"]
    assert skip8["evidence"]["path"] == str(bad) and "model.pt: not a regular file of the checkpoint (a FIFO)" in skip8["detail"]
    shutil.rmtree(bad)
    cfg_path.write_text(original)
    with open(ckpts / "step-6" / "model.pt", "r+b") as f:  # truncated
        f.truncate(10)
    data = bytearray((ckpts / "step-4" / "optim.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, wrong sha256
    (ckpts / "step-4" / "optim.pt").write_bytes(bytes(data))
    (ckpts / "step-2" / "manifest.json").write_text('{"a": ' * 200_000 + "1" + "}" * 200_000)  # too deep to parse
    files = lambda: {p.relative_to(run_dir): p.stat().st_size for p in run_dir.rglob("*")
                     if p.is_file() and p.name != "supervisor.lock"}  # the lock names its last holder
    before = files()

    res = mt("resume", run_dir, "--detach")
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1, err
    assert str(run_dir) in err and "no checkpoint is intact (3 checked" in err
    assert "step-6: model.pt: 10 bytes" in err and "step-4: optim.pt: sha256 mismatch" in err
    assert "step-2: unreadable manifest.json: RecursionError" in err and "--from-scratch" in err
    st = status(run_dir)
    assert st["state"] == "failed" and st["attempt"] == 2  # nothing was started
    assert files() == before

    res = mt("resume", run_dir, "--detach", "--from-scratch")
    assert res.returncode == 0, res.stderr
    start = wait_for(lambda: [e for e in events(run_dir, "run_start") if e["attempt"] == 3], 120, "attempt 3 to start")
    assert start[0]["start_step"] == 0 and start[0]["resumed_from"] is None
    wait_for(lambda: status(run_dir).get("state") == "completed", 120, "the fresh attempt to complete")
    skipped = [e for e in events(run_dir, "incident") if e["code"] == "checkpoint_skipped"]
    assert len(skipped) == 4  # step-8 in attempt 2; then the engine saw the same three, and said so
    assert json.loads((run_dir / "config.json").read_text())["train"]["max_steps"] == 8
