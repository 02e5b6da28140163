"""The dashboard's keys on a live run started by the test (real engine, supervisor, torchrun)."""
from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from mt.contract.jsonl import read_events, read_json
from tests.tui.test_app import wait_for
from tui.view.app import MtApp
from tui.widgets.dialogs import ConfirmScreen

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PRESET = """
[run]
name = "live"
runs_dir = "{runs}"
[launch]
nproc_per_node = 2
device = "cpu"
[model]
vocab_size = 64
n_layer = 1
n_head = 2
d_model = 32
seq_len = 32
[train]
micro_batch_size = 4
max_steps = 2000
lr = 1e-3
min_lr = 1e-4
warmup_steps = 2
[checkpoint]
every_steps = 0
[faults]
step_sleep_s = 0.1
"""

# the same keys on a user's own model and dataset (examples/charlstm), not mt's GPT
REPO = Path(__file__).resolve().parents[2]
USER_MODEL = """
[model]
kind = "python"
factory = "examples.charlstm.model:build"
seq_len = 32
[model.args]
vocab = 16
hidden = 32
layers = 1
dropout = 0.1
[data]
source = "python"
factory = "examples.charlstm.data:build"
[data.args]
n = 2048
seq_len = 32
val_n = 0
"""


def preset_text(runs: Path, model: str) -> str:
    if model == "gpt":
        return PRESET.format(runs=runs)
    gpt_model = PRESET[PRESET.index("[model]"):PRESET.index("[train]")]
    text = PRESET.replace(gpt_model, USER_MODEL.lstrip("\n"))
    # one rank: the keys are the same, and gpt already proves them on torchrun's two ranks; this
    # saves two torchrun start-ups (test_resume proves a user's model on two ranks)
    text = text.replace("nproc_per_node = 2", "nproc_per_node = 1")
    return text.replace("[launch]", f"workdir = {str(REPO)!r}\n[launch]", 1).format(runs=runs)


def status(run_dir: Path) -> dict:
    return read_json(run_dir / "status.json") or {}


def kinds(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_events(run_dir / "events.jsonl") if e.get("kind") == kind]


@pytest.mark.parametrize("model", ["gpt", "python"])
async def test_keys_checkpoint_stop_resume_kill_on_a_live_run(tmp_path, model):
    from tui.supervise.control import kill_run
    from tui.supervise.launch import Overrides, launch_run

    preset = tmp_path / "live.toml"
    preset.write_text(preset_text(tmp_path / "runs", model))
    run_dir = launch_run(preset, Overrides())
    app = MtApp(run_dir, poll_s=0.1, redraw_s=0.1)
    try:
        async with app.run_test(size=(140, 44)) as pilot:
            st = lambda: app.watcher.follower.state
            await wait_for(pilot, lambda: st().state == "running" and (st().step or 0) >= 2, 180)
            header = lambda: str(app.dashboard._header.content)
            await wait_for(pilot, lambda: "RUNNING" in header(), 10)

            # c: a checkpoint event carrying our request id, and a notification naming its step
            await pilot.press("c")
            # (the engine may answer, and the request leave `pending`, before we look)
            assert [a for _, a in app.dashboard.requests.sent] == ["checkpoint"], app.dashboard.said
            rid = app.dashboard.requests.sent[-1][0]
            await wait_for(pilot, lambda: any("checkpoint saved at step" in t for _, t in app.dashboard.said), 60)
            ck = [e for e in kinds(run_dir, "checkpoint") if e.get("request_id") == rid]
            assert len(ck) == 1
            assert ("information", f"checkpoint saved at step {ck[0]['step']}") in app.dashboard.said

            # s: a graceful stop (final checkpoint, state stopped), then c says why it won't
            await pilot.press("s")
            await wait_for(pilot, lambda: st().state == "stopped", 120)
            stopped_at = st().step
            assert kinds(run_dir, "checkpoint")[-1]["reason"] == "stop"
            await pilot.press("c")
            assert app.dashboard.said[-1] == ("warning", "the run is stopped: nothing to checkpoint")

            # r: a new attempt from the newest checkpoint, followed by the same viewer
            await pilot.press("r")
            await wait_for(pilot, lambda: st().attempt == 2 and st().state == "running"
                           and (st().step or 0) > stopped_at, 180)
            await wait_for(pilot, lambda: "attempt 2" in header(), 10)

            # k: asks first; yes kills torchrun and every worker
            workers = [int(p) for p in (status(run_dir).get("worker_pids") or {}).values()]
            await pilot.press("k")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await wait_for(pilot, lambda: st().state == "killed", 120)
            await wait_for(pilot, lambda: not [p for p in workers if psutil.pid_exists(p)
                                               and psutil.Process(p).status() != psutil.STATUS_ZOMBIE], 30)
            await wait_for(pilot, lambda: "KILLED" in header(), 10)
    finally:
        if status(run_dir).get("state") not in ("completed", "stopped", "failed", "killed"):
            kill_run(run_dir, grace_s=2.0)
    # the events of both attempts are valid JSON lines, written by the engine
    assert {e["attempt"] for e in kinds(run_dir, "run_start")} == {1, 2}
    assert json.loads((run_dir / "status.json").read_text())["state"] == "killed"


async def test_c_and_s_on_a_script_that_reports_nothing_through_mt(tmp_path):
    from tui.supervise.control import kill_run
    from tui.supervise.launch import Overrides, launch_run

    script = REPO / "tests" / "library" / "scripts" / "faulty.py"
    preset = tmp_path / "bare.toml"
    preset.write_text(f'[run]\nname = "bare"\nruns_dir = "{tmp_path / "runs"}"\n[launch]\nnproc_per_node = 1\n'
                      f'script = "{script}"\nscript_args = ["--no-mt", "--steps", "100000", "--sleep", "0.1"]\n')
    run_dir = launch_run(preset, Overrides())
    app = MtApp(run_dir, poll_s=0.1, redraw_s=0.1)
    try:
        async with app.run_test(size=(140, 44)) as pilot:
            st = lambda: app.watcher.follower.state
            await wait_for(pilot, lambda: st().state == "running", 120)
            # c: nobody would read the request, and the key says why instead of promising a save
            await pilot.press("c")
            assert app.dashboard.said[-1][0] == "warning" and "checkpoint now needs run.step" in app.dashboard.said[-1][1], app.dashboard.said
            assert app.dashboard.requests.sent == [] and not list((run_dir / "control").glob("*.json"))
            # s: SIGTERM through the supervisor, recorded as stopped
            await pilot.press("s")
            assert "SIGTERM sent" in app.dashboard.said[-1][1], app.dashboard.said
            await wait_for(pilot, lambda: st().state == "stopped", 60)
    finally:
        if status(run_dir).get("state") not in ("completed", "stopped", "failed", "killed"):
            kill_run(run_dir, grace_s=2.0)
    assert status(run_dir)["reason"].startswith("stopped by SIGTERM")
