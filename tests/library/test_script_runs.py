"""Users' own DDP scripts under `mt launch` and under plain torchrun: real ranks, real signals."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import MT, REPO, events, mt, status, toml_text, wait_for

pytestmark = pytest.mark.slow
EXAMPLE = REPO / "examples" / "script" / "train.py"
SCRIPTS = Path(__file__).parent / "scripts"
ARGS = ["--steps", "40", "--sleep", "0.3", "--save-every", "1000"]   # 12 s of steps: the stop lands before 40 on a loaded machine


def _launched(runs: Path, prefix: str) -> Path:
    return wait_for(lambda: next(iter(sorted(runs.glob(f"{prefix}-*"))), None), 30, f"a {prefix} run directory")


def _losses(run_dir: Path) -> dict[int, float]:
    """Loss by step; a resumed attempt's steps replace what followed its checkpoint."""
    return {e["step"]: e["loss"] for e in events(run_dir, "step")}


def test_a_ddp_script_is_watched_checkpointed_stopped_and_resumed_exactly(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    # the same script under plain torchrun, beside it: the reference, and a run mt.init made itself
    # (slower steps, same losses: it must stay live through the launched run's checkpoint and stop,
    # ~15 s on a loaded 2-core machine, and then its own checks: 40 x 0.6 s)
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MT_")}
    plain = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE), *ARGS, "--sleep", "0.6"],
                             cwd=plain_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        launch = mt("launch", EXAMPLE, "--nproc", "2", "--runs-dir", runs, "--detach", "--", *ARGS, cwd=tmp_path)
        assert launch.returncode == 0, launch.stderr
        run_dir = Path(launch.stdout.strip().splitlines()[-1])
        wait_for(lambda: len(events(run_dir, "step")) >= 3, 90, "steps of the launched script")
        once = mt("watch", run_dir, "--once")
        assert once.returncode == 0 and "[running]" in once.stdout and "/40" in once.stdout, once.stdout

        ckpt = mt("ckpt", run_dir, "--timeout", "60")
        assert ckpt.returncode == 0, ckpt.stdout + ckpt.stderr
        saved = events(run_dir, "checkpoint")[-1]
        assert saved["reason"] == "request" and saved["path"] == str(run_dir / "ckpt" / f"step{saved['step']}.pt")

        stop = mt("stop", run_dir, "--timeout", "60")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        st = status(run_dir)
        assert st["state"] == "stopped", st
        final = events(run_dir, "checkpoint")[-1]
        assert final["reason"] == "stop" and Path(final["path"]).is_file()
        stopped_at = events(run_dir, "run_end")[-1]["step"]
        assert final["step"] == stopped_at < 40

        # plain torchrun: mt.init made ./runs/train-<stamp>; mt watch and mt ckpt work on it
        plain_run = _launched(plain_dir / "runs", "train")
        wait_for(lambda: len(events(plain_run, "step")) >= 3, 90, "steps of the plain torchrun run")
        ponce = mt("watch", plain_run, "--once")
        assert ponce.returncode == 0 and "[running]" in ponce.stdout and "/40" in ponce.stdout, ponce.stdout
        pckpt = mt("ckpt", plain_run, "--timeout", "60")
        assert pckpt.returncode == 0, pckpt.stdout + pckpt.stderr
        assert status(plain_run)["owner"] == "script"

        res = mt("resume", run_dir, "--detach")
        assert res.returncode == 0, res.stderr
        wait_for(lambda: status(run_dir).get("state") in ("completed", "failed"), 120, "the resumed attempt to end")
        assert status(run_dir)["state"] == "completed", status(run_dir)
        assert plain.wait(120) == 0, plain.stderr.read()
    finally:
        if plain.poll() is None:
            plain.kill()
    start2 = [e for e in events(run_dir, "run_start") if e["attempt"] == 2]
    assert start2 and start2[0]["start_step"] == stopped_at and start2[0]["resumed_from"] == {"path": final["path"]}
    # stopped, saved in the script's own format and resumed: every loss equals the uninterrupted run's, bit for bit
    reference = _losses(plain_run)
    assert sorted(reference) == list(range(1, 41))
    assert _losses(run_dir) == reference
    assert status(plain_run)["state"] == "completed"


def _script_preset(tmp_path: Path, name: str, args: list[str], restarts: int = 0, script: str = "faulty.py",
                   nproc: int = 2, **monitor: float) -> Path:
    tables = {"run": {"name": name, "runs_dir": str(tmp_path / "runs")},
              "launch": {"script": str(SCRIPTS / script), "script_args": args, "nproc_per_node": nproc,
                         "max_restarts": restarts}}
    if monitor:
        tables["monitor"] = dict(monitor)
    path = tmp_path / f"{name}.toml"
    path.write_text(toml_text(tables))
    return path


def _incidents(run_dir: Path, code: str) -> list[dict]:
    try:
        lines = (run_dir / "incidents.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [r for r in map(json.loads, lines) if r.get("code") == code]


def test_script_faults_are_diagnosed_with_the_rank(tmp_path: Path) -> None:
    # with mt: a crash on rank 1 is diagnosed with rank 1; the automatic restart resumes from
    # the checkpoint the script reported and completes (running beside the next case)
    crash_preset = _script_preset(tmp_path, "crash", ["--fault", "crash", "--at", "4", "--save-at", "3", "--steps", "8"],
                                  restarts=1)
    crash = subprocess.Popen([*MT, "launch", str(crash_preset), "--headless"], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        # a script that never calls mt: supervised, its out-of-memory error classified with the rank
        oom = mt("launch", SCRIPTS / "faulty.py", "--nproc", "2", "--runs-dir", tmp_path / "runs", "--name", "oom",
                 "--headless", "--", "--no-mt", "--fault", "oom", "--at", "3", cwd=tmp_path)
        assert oom.returncode == 1, oom.stdout + oom.stderr
        oom_dir = _launched(tmp_path / "runs", "oom")
        found = _incidents(oom_dir, "oom")
        assert found and found[0]["evidence"]["rank"] == 1, (oom_dir / "incidents.jsonl").read_text()
        once = mt("watch", oom_dir, "--once").stdout
        assert "[failed]" in once and "run.step" in once  # says what the script would gain from mt
        crash_out, crash_err = crash.communicate(timeout=240)
    finally:
        crash.kill()
    crash_dir = _launched(tmp_path / "runs", "crash")
    found = _incidents(crash_dir, "crash")
    assert found and found[0]["evidence"]["rank"] == 1, (crash_dir / "incidents.jsonl").read_text()
    assert "rank 1: RuntimeError: injected crash on rank 1 at step 4" in crash_out, crash_out
    assert crash.returncode == 0 and status(crash_dir)["state"] == "completed", crash_out + crash_err
    start2 = [e for e in events(crash_dir, "run_start") if e["attempt"] == 2][0]
    assert start2["start_step"] == 3 and start2["resumed_from"] == {"path": str(crash_dir / "ckpt-3.json")}
    assert [e["step"] for e in events(crash_dir, "step") if e["t"] > start2["t"]] == [4, 5, 6, 7, 8]

    # with mt: a hang on rank 1 is named by the hang rule (alone: its timing is the point)
    hang = mt("launch", _script_preset(tmp_path, "hang", ["--fault", "hang", "--at", "6", "--steps", "400"],
                                       hang_floor_s=5.0), "--detach")
    assert hang.returncode == 0, hang.stderr
    hang_dir = Path(hang.stdout.strip().splitlines()[-1])
    found = wait_for(lambda: _incidents(hang_dir, "hang"), 90, "a hang incident")
    assert found[0]["evidence"]["suspect_ranks"] == [1] and found[0]["step"] == 6, found[0]
    assert mt("kill", hang_dir).returncode == 0
    from tui.read.procs import run_processes
    assert run_processes(hang_dir) == []  # no orphan of the script's ranks


def test_the_hf_trainer_adapter_saves_on_c_and_stops_on_s(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")  # the Trainer needs it (in the hf extra)
    launch = mt("launch", SCRIPTS / "hf_trainer.py", "--nproc", "2", "--runs-dir", tmp_path / "runs", "--detach",
                "--", "2000", cwd=tmp_path)
    assert launch.returncode == 0, launch.stderr
    run_dir = Path(launch.stdout.strip().splitlines()[-1])
    try:
        wait_for(lambda: len(events(run_dir, "step")) >= 3, 120, "Trainer steps")
        step = events(run_dir, "step")[-1]
        assert step["loss"] > 0 and step["lr"] > 0 and step["grad_norm"] > 0
        ckpt = mt("ckpt", run_dir, "--timeout", "60")
        assert ckpt.returncode == 0, ckpt.stdout + ckpt.stderr
        saved = events(run_dir, "checkpoint")[-1]
        assert saved["path"] == str(tmp_path / "hf-out" / f"checkpoint-{saved['step']}") and saved["reason"] == "request"
        assert (Path(saved["path"]) / "model.safetensors").is_file() and (Path(saved["path"]) / "trainer_state.json").is_file()
        stop = mt("stop", run_dir, "--timeout", "60")
        assert stop.returncode == 0, stop.stdout + stop.stderr
    finally:
        mt("kill", run_dir)
    assert status(run_dir)["state"] == "stopped"
    final = events(run_dir, "checkpoint")[-1]
    assert final["reason"] == "stop" and Path(final["path"]).is_dir() and final["step"] > saved["step"]
    # each request (2 s saves) accepted once, answered once, saved once
    assert [(c["reason"], c["step"]) for c in events(run_dir, "checkpoint")] == [("request", saved["step"]), ("stop", final["step"])]
    answers = [(c["request_id"], c["status"]) for c in events(run_dir, "control")]
    assert sorted(answers) == sorted({(rid, s) for rid, _ in answers for s in ("accepted", "done")}), answers
    assert sorted(p.name for p in (tmp_path / "hf-out").iterdir()) == sorted(Path(c["path"]).name for c in events(run_dir, "checkpoint"))


def test_a_script_without_mt_calls_gets_the_stall_rule_from_proc(tmp_path: Path) -> None:
    launch = mt("launch", _script_preset(tmp_path, "stall", [], script="slow_loader.py", nproc=1, stall_window_s=4.0),
                "--detach")
    assert launch.returncode == 0, launch.stderr
    run_dir = Path(launch.stdout.strip().splitlines()[-1])
    try:
        found = wait_for(lambda: _incidents(run_dir, "dataloader_stall"), 90, "a dataloader_stall incident")
        # nobody reads control/: checkpoint-now is refused at once, stop is a SIGTERM
        t0 = time.monotonic()
        ckpt = mt("ckpt", run_dir, "--timeout", "60")
        assert ckpt.returncode == 2 and time.monotonic() - t0 < 20, ckpt.stdout + ckpt.stderr
        assert "checkpoint now needs run.step" in ckpt.stderr and len(ckpt.stderr.splitlines()) == 1, ckpt.stderr
        assert not [p for p in (run_dir / "control").iterdir() if p.suffix == ".json"]
        stop = mt("stop", run_dir, "--timeout", "60")
        assert stop.returncode == 0 and status(run_dir)["state"] == "stopped", stop.stdout + stop.stderr + str(status(run_dir))
        assert status(run_dir)["reason"].startswith("stopped by SIGTERM"), status(run_dir)
    finally:
        mt("kill", run_dir)
    ev = found[0]["evidence"]
    assert ev["in_progress"] and ev["blocked_s"] >= 2.0 and ev["ranks"]["0"]["workers"], found[0]
    assert not _incidents(run_dir, "hang")  # no steps is not a hang for a script that reports none


def test_a_one_process_script_gets_what_torchrun_gives_and_resumes(tmp_path: Path) -> None:
    # faulty.py calls init_process_group("gloo") whatever the world size, as most scripts do;
    # one process runs without torchrun, and still gets MASTER_ADDR/MASTER_PORT and the rest
    args = ["--nproc", "1", "--runs-dir", tmp_path / "runs", "--headless"]
    first = mt("launch", SCRIPTS / "faulty.py", *args, "--name", "one", "--",
               "--fault", "crash", "--rank", "0", "--at", "4", "--save-at", "3", "--steps", "6", cwd=tmp_path)
    run_dir = _launched(tmp_path / "runs", "one")
    assert first.returncode == 1 and status(run_dir)["direct"], first.stdout + first.stderr
    assert status(run_dir)["reason"] == "rank 0: RuntimeError: injected crash on rank 0 at step 4", status(run_dir)
    resumed = mt("resume", run_dir, "--headless")
    assert resumed.returncode == 0 and status(run_dir)["state"] == "completed", resumed.stdout + resumed.stderr
    start2 = [e for e in events(run_dir, "run_start") if e["attempt"] == 2][0]
    assert start2["start_step"] == 3 and [e["step"] for e in events(run_dir, "step") if e["t"] > start2["t"]] == [4, 5, 6]

    # a failure with nothing from mt says what ran: the script, not a torchrun that never ran
    bare = mt("launch", SCRIPTS / "faulty.py", *args, "--name", "bare", "--",
              "--no-mt", "--fault", "crash", "--rank", "0", "--at", "2", cwd=tmp_path)
    bare_dir = _launched(tmp_path / "runs", "bare")
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert status(bare_dir)["reason"] == "the script faulty.py exited with code 1; see logs/rank0.log", status(bare_dir)
    assert "injected crash on rank 0 at step 2" in (bare_dir / "logs" / "rank0.log").read_text()
    # it reported no step, so the incident names none (it said "at step 1")
    assert "incident [error] crash before the first step: Worker crashed: rank 0 before the first step" in bare.stdout, bare.stdout


@pytest.mark.parametrize("how", ["mt kill", "SIGUSR1 to the supervisor"])
def test_mt_kill_of_a_script_saves_no_checkpoint_and_deletes_none(tmp_path: Path, how: str) -> None:
    # a script that saves every 5 steps and keeps the newest 2, as keep_last does: a kill must not
    # save the state the user meant to discard, nor let the script's pruning delete a good save for it.
    # The supervisor's own kill path (a lone SIGUSR1, as `scancel --signal=USR1` sends it) saves nothing either
    every, keep = 5, 2
    args = ["--save-every", str(every), "--keep", str(keep), "--sleep", "0.05", "--steps", "100000"]
    launch = mt("launch", _script_preset(tmp_path, "killed", args, restarts=1, script="plain_loop.py", nproc=1), "--detach")
    assert launch.returncode == 0, launch.stderr
    run_dir = Path(launch.stdout.strip().splitlines()[-1])
    try:
        wait_for(lambda: len(events(run_dir, "checkpoint")) >= keep, 90, f"{keep} interval checkpoints")
        if how == "mt kill":
            kill = mt("kill", run_dir, "--grace", "5")
            assert kill.returncode == 0, kill.stdout + kill.stderr
        else:
            os.kill(status(run_dir)["supervisor_pid"], signal.SIGUSR1)
            wait_for(lambda: status(run_dir)["state"] == "killed", 60, "the supervisor to record the kill")
    finally:
        mt("kill", run_dir)
    st = status(run_dir)
    assert st["state"] == "killed" and st["reason"] == "killed by mt kill" and st["attempt"] == 1, st  # not restarted
    saved = events(run_dir, "checkpoint")
    assert [(c["reason"], c["step"] % every) for c in saved] == [("script", 0)] * len(saved), saved
    newest = saved[-1]["step"]
    on_disk = sorted(int(p.stem[5:]) for p in run_dir.glob("ckpt-*.json"))
    assert on_disk == [newest - every * (keep - 1 - i) for i in range(keep)], (on_disk, newest)
    assert not [e for e in events(run_dir, "run_end") if e["status"] == "stopped"]   # no graceful stop either
    assert not _incidents(run_dir, "crash"), (run_dir / "incidents.jsonl").read_text()   # a kill is no crash


def test_every_view_names_the_error_line_of_a_script_that_failed_before_mt_init(tmp_path: Path) -> None:
    from tui.read.follower import load_run_state
    from tui.widgets.notice import notice_text

    script = tmp_path / "argy.py"
    script.write_text("import argparse\nimport mt\np = argparse.ArgumentParser()\np.add_argument('--steps', type=int)\n"
                      "a = p.parse_args()\nrun = mt.init(config=vars(a))\nrun.finish()\n")
    said = "argy.py: error: unrecognized arguments: --stepz 10"
    res = mt("launch", script, "--runs-dir", tmp_path / "runs", "--headless", "--", "--stepz", "10", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"run failed (rank 0: {said})" in res.stdout, res.stdout
    run_dir = _launched(tmp_path / "runs", "argy")
    once = mt("watch", run_dir, "--once").stdout
    assert f"reason: rank 0: {said}" in once, once
    assert "reported nothing through mt" not in once and "failed before it called mt.init" in once, once
    notice = str(notice_text(load_run_state(run_dir), [], 0))
    assert f"first failure: rank 0: {said}" in notice, notice


def test_a_trainer_run_says_its_precision_device_batch_clip_and_tokens_and_diffs_by_its_arguments(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")  # the Trainer needs it (in the hf extra)
    runs, dirs = tmp_path / "runs", []
    for lr in ("1e-3", "3e-3"):
        res = mt("launch", SCRIPTS / "hf_facts.py", "--nproc", "1", "--runs-dir", runs, "--headless", "--", lr, "6", cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        dirs.append(Path(next(ln for ln in res.stdout.splitlines() if ln.startswith("run dir: ")).split(": ", 1)[1]))
    start = events(dirs[0], "run_start")[-1]
    assert (start["precision"], start["device"], start["effective_batch"], start["grad_clip"]) == ("fp32", "cpu", 8, 0.5)
    steps = events(dirs[0], "step")
    assert [s["step"] for s in steps] == list(range(1, 7))
    # the Trainer's fractional epoch, as it logs it: 256 samples, 8 a step, so step 6 is epoch 0.1875
    assert [s["epoch"] for s in steps] == [s / 32 for s in range(1, 7)], steps
    params = start["params_total"]
    assert params > 0 and start["params_trainable"] == params   # all trained: the header says no "trainable"
    # the Trainer counts 8 x 32 tokens a step: from the second log on, each step's time and rate
    assert all(s["tokens_per_s"] > 0 and s["step_time_s"] > 0 for s in steps[1:]), steps
    assert all(abs(s["tokens_per_s"] * s["step_time_s"] - 256) < 1e-6 * 256 for s in steps[1:]), steps
    once = mt("watch", dirs[0], "--once").stdout
    assert "world 1 x cpu  precision fp32  eff. batch 8" in once and "tok/s N/A" not in once, once
    assert "step 6/6  epoch 0.19  elapsed" in once and "trainable" not in once, once
    assert "epoch 0.19  loss" in res.stdout, res.stdout   # the last headless step line (the second run's)
    from tui.read.follower import load_run_state
    assert load_run_state(dirs[0]).grad_clip == 0.5   # the grad-norm plot's red line
    config = json.loads((dirs[0] / "config.json").read_text())
    assert set(config) <= {"run", "launch", "monitor", "slurm"}, config   # no unused engine defaults (model.n_layer ...)
    diff = mt("diff", *dirs).stdout
    row = next(ln.split() for ln in diff.splitlines() if ln.startswith("args.learning_rate"))
    assert row[1:] == ["0.001", "0.003"], diff
    assert "model.n_layer" not in diff and "launch.script_args" in diff, diff


ACCELERATE = REPO / "examples" / "accelerate" / "train.py"


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_accelerate_example_is_checkpointed_stopped_and_resumed_exactly(tmp_path: Path, nproc: int) -> None:
    pytest.importorskip("accelerate")
    runs, steps = tmp_path / "runs", "30"   # 200 samples, 8 a process and step: an epoch is 25 (1 process) or 12 steps
    ref = mt("launch", ACCELERATE, "--nproc", str(nproc), "--runs-dir", runs / "ref", "--headless", "--", "--steps", steps, cwd=tmp_path)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    launch = mt("launch", ACCELERATE, "--nproc", str(nproc), "--runs-dir", runs / "cut", "--detach", "--",
                "--steps", steps, "--sleep", "0.3", cwd=tmp_path)
    assert launch.returncode == 0, launch.stderr
    run_dir = Path(launch.stdout.strip().splitlines()[-1])
    try:
        wait_for(lambda: len(events(run_dir, "step")) >= 3, 120, "steps of the Accelerate script")
        ckpt = mt("ckpt", run_dir, "--timeout", "60")
        assert ckpt.returncode == 0, ckpt.stdout + ckpt.stderr
        # past the first epoch (12 steps on 2 processes), so the resumed one starts mid-epoch, not at epoch 0
        wait_for(lambda: len(events(run_dir, "step")) >= 14, 120, "the second epoch")
        stop = mt("stop", run_dir, "--timeout", "60")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        stopped_at = events(run_dir, "run_end")[-1]["step"]
        assert stopped_at < int(steps) and events(run_dir, "checkpoint")[-1]["reason"] == "stop"
        res = mt("resume", run_dir, "--detach")
        assert res.returncode == 0, res.stderr
        wait_for(lambda: status(run_dir).get("state") in ("completed", "failed"), 180, "the resumed attempt to end")
    finally:
        mt("kill", run_dir)
    assert status(run_dir)["state"] == "completed", status(run_dir)
    assert [e["start_step"] for e in events(run_dir, "run_start")] == [0, stopped_at]
    reference = _losses(next((runs / "ref").iterdir()))
    assert sorted(reference) == list(range(1, int(steps) + 1))
    assert _losses(run_dir) == reference   # every logged loss, bit for bit
