"""The PyTorch Lightning adapter: a real Trainer, DDP over 2 CPU processes under `mt launch`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, events, mt, status, wait_for

EXAMPLE = REPO / "examples" / "lightning" / "train.py"
STEPS = 60  # c and s land by step ~30 on a loaded 2-core machine (0.15 s a step)


def test_importing_the_adapter_without_lightning_names_the_extra() -> None:
    # lightning made unimportable in a fresh interpreter (None in sys.modules: import raises ImportError)
    code = ("import sys; sys.modules['lightning'] = None; import mt, mt.integrations\n"
            "try:\n    import mt.integrations.lightning\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == [
        'mt.integrations.lightning needs PyTorch Lightning: pip install -e ".[lightning]" (or pip install lightning)']


@pytest.mark.slow
def test_the_lightning_callback_saves_on_c_stops_on_s_and_resumes_at_the_next_step(tmp_path: Path) -> None:
    pytest.importorskip("lightning")  # the lightning extra
    launch = mt("launch", EXAMPLE, "--nproc", "2", "--runs-dir", tmp_path / "runs", "--detach",
                "--", "--steps", str(STEPS), "--sleep", "0.15", cwd=tmp_path)
    assert launch.returncode == 0, launch.stderr
    run_dir = Path(launch.stdout.strip().splitlines()[-1])
    try:
        wait_for(lambda: len(events(run_dir, "step")) >= 3, 180, "Trainer steps")
        step = events(run_dir, "step")[-1]
        # the loss it returned, the optimizer's lr, and what training_step logged
        assert step["loss"] > 0 and step["lr"] == 0.05 and step["extra"]["abs_err"] > 0, step
        assert step["epoch"] == 0 and "epoch" not in step["extra"], step   # Lightning's whole epoch (256 steps each)
        ckpt = mt("ckpt", run_dir, "--timeout", "60")
        assert ckpt.returncode == 0, ckpt.stdout + ckpt.stderr
        saved = events(run_dir, "checkpoint")[-1]
        assert saved["reason"] == "request" and saved["path"] == str(run_dir / "ckpt" / f"step{saved['step']}.ckpt")
        stop = mt("stop", run_dir, "--timeout", "60")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        wait_for(lambda: status(run_dir).get("state") not in (None, "running", "starting"), 60, "the run to end")
    finally:
        mt("kill", run_dir)
    assert status(run_dir)["state"] == "stopped", status(run_dir)
    final = events(run_dir, "checkpoint")[-1]
    stopped_at = events(run_dir, "run_end")[-1]["step"]
    assert final["reason"] == "stop" and final["step"] == stopped_at < STEPS and final["step"] > saved["step"]
    # each request accepted once, answered once, saved once: one file each, the Trainer's own format
    assert [(c["reason"], c["step"]) for c in events(run_dir, "checkpoint")] == [("request", saved["step"]), ("stop", final["step"])]
    answers = [(c["request_id"], c["status"]) for c in events(run_dir, "control")]
    assert sorted(answers) == sorted({(rid, s) for rid, _ in answers for s in ("accepted", "done")}) and len(answers) == 4, answers
    assert sorted(p.name for p in (run_dir / "ckpt").iterdir()) == sorted(Path(c["path"]).name for c in events(run_dir, "checkpoint"))

    res = mt("resume", run_dir, "--detach")
    assert res.returncode == 0, res.stderr
    import torch  # while the resumed attempt starts (seconds of this process's CPU)
    assert torch.load(final["path"], weights_only=False)["global_step"] == final["step"]
    wait_for(lambda: status(run_dir).get("state") in ("completed", "failed", "stopped"), 240, "the resumed attempt to end")
    assert status(run_dir)["state"] == "completed", status(run_dir)
    every = events(run_dir)
    second = next(i for i, e in enumerate(every) if e["kind"] == "run_start" and e["attempt"] == 2)
    assert every[second]["start_step"] == final["step"] and every[second]["resumed_from"] == {"path": final["path"]}
    # the Trainer restored from cb.resume_from: the new attempt's first step is the saved one + 1, and it goes on to the end
    assert [e["step"] for e in every[second:] if e["kind"] == "step"] == list(range(final["step"] + 1, STEPS + 1))


@pytest.mark.slow
def test_sigterm_to_a_lightning_script_saves_and_stops_it(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    import os
    import signal

    # plain python: mt.init (in the callback's setup) makes ./runs/train-<stamp> itself
    env = {k: v for k, v in os.environ.items() if not k.startswith("MT_")}
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--steps", "400", "--sleep", "0.1"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        run_dir = wait_for(lambda: next(iter((tmp_path / "runs").glob("train-*")), None), 120, "the run directory")
        wait_for(lambda: len(events(run_dir, "step")) >= 2, 120, "steps")
        proc.send_signal(signal.SIGTERM)  # Lightning's handler and mt's both see it: saved at the next batch end
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        proc.kill()
    end, saves = events(run_dir, "run_end")[-1], events(run_dir, "checkpoint")
    assert (end["status"], end["reason"]) == ("stopped", "SIGTERM received") and end["step"] < 400, end
    assert [(c["reason"], c["step"]) for c in saves] == [("stop", end["step"])] and Path(saves[0]["path"]).is_file()
    assert status(run_dir)["state"] == "stopped"
