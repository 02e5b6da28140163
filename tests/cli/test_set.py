"""`mt set RUN KEY=VALUE...`: knobs of a live run, checked before anything is written, answered like a
checkpoint request; a script's run refuses them."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.optim import lr_at
from mt.contract.preset import config_from_dict, load_config_json
from tests.cli.conftest import events, mt, run_dir_from, wait_for, write_preset
from tests.engine.runner import SMALL as ENGINE_SMALL
from tests.engine.runner import merge


def _requests(run_dir: Path) -> list[str]:
    control = run_dir / "control"
    return sorted(p.name for p in control.rglob("*")) if control.exists() else []


@pytest.mark.slow
def test_mt_set_turns_the_lr_of_a_live_run_from_the_step_it_names_and_refuses_bad_input_first(tmp_path: Path, runs: Path) -> None:
    preset = write_preset(tmp_path / "p.toml", runs, launch={"nproc_per_node": 1}, train={"max_steps": 4000, "log_every": 1},
                          checkpoint={"every_steps": 0}, faults={"step_sleep_s": 0.05})
    res = mt("launch", preset, "--detach", "--name", "knobs")
    assert res.returncode == 0, res.stderr
    run_dir = run_dir_from(res.stdout)
    try:
        wait_for(lambda: events(run_dir, "step"), 180, "the first step")
        before = _requests(run_dir)
        for bad, says in ((["lr=3"], "lr: not a knob"), (["lr_scale=0"], "lr_scale: '0' must be > 0"),
                          (["log_every=2", "log_every=3"], "log_every: given twice"), (["eval_every"], "expected KEY=VALUE")):
            out = mt("set", run_dir, *bad)
            assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert _requests(run_dir) == before   # refused before anything was written

        out = mt("set", run_dir, "lr_scale=0.25", "eval_every=0", "--timeout", "60")
        assert out.returncode == 0, out.stdout + out.stderr
        first = int(out.stdout.split("applied from step ")[1].split(":")[0])
        assert out.stdout.strip() == f"set done: applied from step {first}: lr_scale=0.25, eval_every=0"
        wait_for(lambda: any(s["step"] >= first + 2 for s in events(run_dir, "step")), 60, "steps after the set")
        once = mt("watch", run_dir, "--once")
        assert "knobs lr×0.25 eval/0" in once.stdout, once.stdout
    finally:
        mt("kill", run_dir, "--grace", "2")
    train = load_config_json(run_dir / "config.json").train
    for s in events(run_dir, "step"):   # the scheduler's lr before the set, scaled from the step it names
        assert s["lr"] == lr_at(s["step"], train) * (0.25 if s["step"] >= first else 1.0), s["step"]
    knob = [k for k in events(run_dir, "knob") if k["key"] == "lr_scale"]
    assert [(k["step"], k["value"], k["previous"], k["by"]) for k in knob] == [(first, 0.25, 1.0, "user")]


def test_mt_set_refuses_a_scripts_run_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "script-run"
    run_dir.mkdir()
    cfg = config_from_dict(merge(ENGINE_SMALL, {"launch": {"script": "train.py"}}), "test")
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.1)   # status.json written after the process started, as a supervisor writes it
        (run_dir / "status.json").write_text(json.dumps({"state": "running", "attempt": 1, "supervisor_pid": supervisor.pid}))
        out = mt("set", run_dir, "lr_scale=0.5")
    finally:
        supervisor.kill()
    assert out.returncode == 2 and "the run's script reads no knobs" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (run_dir / "control").exists()
