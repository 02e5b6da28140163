"""Bad input: one line naming the file and key, exit 2, no run directory, no process."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from mt.contract.paths import RunPaths
from tests.cli.conftest import SMALL, mt, toml_text, write_preset
from tests.tui.synth import write_status
from tui.cli import app
from tui.supervise.launch import Overrides, create_run

runner = CliRunner()

# (case id, preset overrides or raw TOML text, extra CLI args, words the error line must contain)
CASES: list[tuple[str, Any, list[str], list[str]]] = [
    ("invalid-toml", "[run]\nname = \"x\"\nlr = = 3\n", [], ["invalid TOML", "line 4, column 6"]),
    ("empty-file", "", [], ["run", "missing"]),
    ("unknown-section", {"optimizer": {"lr": 1.0}}, [], ["optimizer", "unknown section"]),
    ("unknown-key", {"train": {"learning_rate": 1.0}}, [], ["train.learning_rate", "unknown key"]),
    ("lr-wrong-type", {"train": {"lr": "fast"}}, [], ["train.lr", '"fast"']),
    ("lr-zero", {"train": {"lr": 0.0, "min_lr": 0.0}}, [], ["train.lr", "> 0"]),
    ("lr-negative", {"train": {"lr": -1e-3, "min_lr": 0.0}}, [], ["train.lr", "> 0"]),
    ("micro-batch-zero", {"train": {"micro_batch_size": 0}}, [], ["train.micro_batch_size", ">= 1"]),
    ("max-steps-zero", {"train": {"max_steps": 0, "warmup_steps": 0}}, [], ["train.max_steps"]),
    ("n-head-not-dividing", {"model": {"n_head": 3}}, [], ["model.n_head", "divide"]),
    ("dropout-out-of-range", {"model": {"dropout": 1.5}}, [], ["model.dropout"]),
    ("precision-choice", {"train": {"precision": "fp8"}}, [], ["train.precision", "fp8"]),
    ("device-choice", {"launch": {"device": "tpu"}}, [], ["launch.device", "tpu"]),
    ("betas-wrong-type", {"train": {"betas": ["a", "b"]}}, [], ["train.betas"]),
    ("warmup-beyond-max", {"train": {"warmup_steps": 1000}}, [], ["train.warmup_steps"]),
    ("nproc-zero-in-preset", {"launch": {"nproc_per_node": 0}}, [], ["launch.nproc_per_node", ">= 1"]),
    ("nproc-zero-option", {}, ["--nproc", "0"], ["--nproc 0: launch.nproc_per_node", ">= 1"]),
    ("rdzv-no-port", {"launch": {"nnodes": 2, "rdzv_endpoint": "localhost"}}, [], ["launch.rdzv_endpoint", "host:port"]),
    ("rdzv-bad-port", {"launch": {"nnodes": 2, "rdzv_endpoint": "127.0.0.1:70000"}}, [], ["launch.rdzv_endpoint"]),
    ("rdzv-missing", {"launch": {"nnodes": 2}}, [], ["launch.rdzv_endpoint", "required"]),
    ("node-rank-too-big", {"launch": {"nnodes": 2, "rdzv_endpoint": "127.0.0.1:29999"}}, ["--node-rank", "2"], ["launch.node_rank"]),
    ("bad-run-name", {"run": {"name": "my run"}}, [], ["run.name"]),
    ("bad-name-option", {}, ["--name", "a/b"], ["--name a/b: run.name"]),
    ("name-dot-dot", {}, ["--name", ".."], ["run.name", "must not start with '.'"]),
    ("name-hidden", {"run": {"name": ".hidden"}}, [], ["run.name", "must not start with '.'"]),
    ("name-too-long", {}, ["--name", "n" * 300], ["--name", "run.name", "at most 200 characters, got 300"]),
    ("data-path-a-directory", {"data": {"source": "text", "path": "/tmp"}}, [], ["data.path", "a directory, not a regular file"]),
    ("data-path-a-device", {"data": {"source": "tokens", "path": "/dev/null"}}, [], ["data.path", "a character device"]),
    ("data-path-missing", {"data": {"source": "text", "path": "/nonexistent/corpus.txt"}}, [], ["data.path", "no such file"]),
    ("data-path-required", {"data": {"source": "tokens"}}, [], ["data.path", "required"]),
    ("strategy-choice", {"train": {"strategy": "zero3"}}, [], ["train.strategy", "zero3"]),
    ("fsdp-unknown-key", {"train": {"fsdp": {"shard": True}}}, [], ["train.fsdp.shard", "unknown key"]),
    ("fsdp-wrap-for-gpt", {"train": {"fsdp": {"wrap": ["Block"]}}}, [], ["train.fsdp.wrap", "model.kind"]),
    ("checkpoint-format-choice", {"checkpoint": {"format": "zip"}}, [], ["checkpoint.format", "auto, full, sharded", '"zip"']),
    ("checkpoint-async-type", {"checkpoint": {"async": "yes"}}, [], ["checkpoint.async", "true or false"]),
    ("checkpoint-async-full", {"checkpoint": {"async": True}}, [], ["checkpoint.async", "sharded", "blocking"]),
    ("fsdp-factory-without-wrap", {"model": {"kind": "python", "factory": "m:build"}, "train": {"strategy": "fsdp"}}, [],
     ["train.fsdp.wrap", "block class names"]),
    ("section-not-a-table", "model = 3\n[run]\nname = \"x\"\n", [], ["model", "table"]),
    # CUDA_VISIBLE_DEVICES is emptied for every case below: no GPU, on any machine
    ("cuda-without-gpu", {"launch": {"device": "cuda"}}, [], ["launch.device", "no NVIDIA GPU is visible"]),
    ("compile-not-bool", {"train": {"compile": "yes"}}, [], ["train.compile", "true or false"]),
    # inductor's C++ compiler missing (ENV below): at launch, not at step 1
    ("compile-cxx-nowhere", {"train": {"compile": True}}, [], ["train.compile", "CXX='/nonexistent/c++' is no executable file"]),
    ("compile-no-compiler-on-path", {"train": {"compile": True}}, [], ["train.compile", "g++ (CXX is not set)", "not found on PATH"]),
]
# environment of a case ({tmp}: its empty tmp_path; None: unset)
ENV: dict[str, dict[str, str | None]] = {
    "compile-cxx-nowhere": {"CXX": "/nonexistent/c++"},
    "compile-no-compiler-on-path": {"CXX": None, "PATH": "{tmp}"},
}


def _no_process_mentions(path: Path) -> bool:
    needle = str(path)
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != os.getpid() and any(needle in a for a in p.info["cmdline"] or []):
            return False
    return True


@pytest.mark.parametrize("case, preset, extra, words", CASES, ids=[c[0] for c in CASES])
def test_bad_preset_is_rejected_before_anything_exists(tmp_path: Path, case: str, preset: Any,
                                                       extra: list[str], words: list[str], monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for k, v in ENV.get(case, {}).items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v.format(tmp=tmp_path))
    runs = tmp_path / "runs"
    path = tmp_path / "p.toml"
    if isinstance(preset, str):
        path.write_text(preset.replace("[run]\n", f"[run]\nruns_dir = {str(runs)!r}\n", 1)
                        if "[run]" in preset else preset)
    else:
        write_preset(path, runs, **preset)
    result = runner.invoke(app, ["launch", str(path), "--detach", *extra])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    # a value given on the command line is blamed on its flag, not on the preset file
    assert (str(path) not in err and err.startswith(f"mt: {extra[0]} ")) if extra else str(path) in err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"
    assert not runs.exists(), "a run directory was created for bad input"
    assert _no_process_mentions(tmp_path)


def test_missing_preset(tmp_path: Path) -> None:
    result = runner.invoke(app, ["launch", str(tmp_path / "nope.toml"), "--detach"])
    assert result.exit_code == 2
    assert "nope.toml" in result.stderr and "no such file" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["under-a-file", "proc"])
def test_runs_dir_that_cannot_be_written(tmp_path: Path, kind: str) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    runs = blocker / "runs" if kind == "under-a-file" else Path("/proc/mt-test-runs")
    path = write_preset(tmp_path / "p.toml", runs)
    result = runner.invoke(app, ["launch", str(path), "--detach"])
    assert result.exit_code == 2, result.stderr
    assert "run.runs_dir" in result.stderr and str(path) in result.stderr
    assert not runs.exists()


def _made_run(tmp_path: Path, state: str) -> Path:
    """A run directory made by the real create_run, with the state a supervisor would leave."""
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs")
    run_dir = create_run(preset, Overrides())
    status = {"state": state, "attempt": 1, "supervisor_pid": None, "ended": time.time()}
    write_status(RunPaths(run_dir), status)
    return run_dir


@pytest.mark.parametrize("command", ["watch", "ckpt", "stop", "kill", "resume", "rollback"])
def test_not_a_run_dir(tmp_path: Path, command: str) -> None:
    (tmp_path / "stuff").mkdir()
    for target in (tmp_path / "stuff", tmp_path / "missing"):
        args = [command, str(target)] + (["--once"] if command == "watch" else [])
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (command, result.stderr)
        assert str(target) in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["ckpt", "stop", "kill"])
def test_finished_run_cannot_be_controlled(tmp_path: Path, command: str) -> None:
    run_dir = _made_run(tmp_path, "completed")
    result = runner.invoke(app, [command, str(run_dir)])
    assert result.exit_code == 2, result.stderr
    assert "already ended (completed)" in result.stderr
    assert list((run_dir / "control").iterdir()) == [], "a request was dropped into a finished run"


def test_resume_without_checkpoint(tmp_path: Path) -> None:
    run_dir = _made_run(tmp_path, "stopped")
    result = runner.invoke(app, ["resume", str(run_dir), "--detach"])
    assert result.exit_code == 2
    assert "no checkpoint" in result.stderr
    assert "supervisor_pid" in (run_dir / "status.json").read_text()
    assert _no_process_mentions(run_dir)


def test_resume_completed_run(tmp_path: Path) -> None:
    run_dir = _made_run(tmp_path, "completed")
    result = runner.invoke(app, ["resume", str(run_dir), "--detach"])
    assert result.exit_code == 2 and "already completed" in result.stderr


def test_resume_bad_nproc(tmp_path: Path) -> None:
    run_dir = _made_run(tmp_path, "stopped")
    result = runner.invoke(app, ["resume", str(run_dir), "--nproc", "0"])
    assert result.exit_code == 2 and "--nproc" in result.stderr


def test_toml_error_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(toml_text(SMALL) + "oops = \n")
    result = runner.invoke(app, ["launch", str(path)])
    assert result.exit_code == 2
    assert "line" in result.stderr and "column" in result.stderr


def test_resume_refuses_while_a_process_of_the_run_lives(tmp_path: Path) -> None:
    import subprocess
    import sys

    run_dir = _made_run(tmp_path, "stopped")
    ckpt = run_dir / "checkpoints" / "step-4"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text("{}")
    # stands in for a worker of the last attempt that is still finishing its graceful stop
    straggler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--run-dir", str(run_dir)])
    try:
        result = runner.invoke(app, ["resume", str(run_dir), "--detach"])
        assert result.exit_code == 2, result.stderr
        assert "still running" in result.stderr and str(straggler.pid) in result.stderr
    finally:
        straggler.kill()
        straggler.wait()
    assert (run_dir / "status.json").read_text().count('"stopped"') == 1


def test_ls_of_a_missing_folder(tmp_path: Path) -> None:
    result = runner.invoke(app, ["ls", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such directory" in result.stderr


def test_resume_without_any_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # `mt resume` alone looks for the newest run under ./runs
    result = runner.invoke(app, ["resume"])
    assert result.exit_code == 2 and "no run under runs/" in result.stderr


def test_far_more_cpu_ranks_than_cores_is_a_warning(tmp_path: Path) -> None:
    from mt.contract.preset import load_preset
    from tui.read.procs import usable_cores
    from tui.supervise.devices import device_warnings

    cores = usable_cores()
    many = load_preset(write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 4 * cores}))
    warning, = device_warnings(many)
    assert f"launch.nproc_per_node = {4 * cores} CPU ranks on {cores} usable cores" in warning
    assert device_warnings(load_preset(write_preset(tmp_path / "q.toml", tmp_path / "runs", launch={"nproc_per_node": 1}))) == []


def test_script_arguments_without_their_double_dash_say_where_they_go(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint(sys.argv)\n")
    res = mt("launch", script, "--nproc", "1", "--steps", "3", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--steps" in lines[0] and "after --" in lines[0], res.stderr
    assert f"mt launch {script} -- --steps 3" in lines[0]
    assert not (tmp_path / "runs").exists()
    res = mt("launch", tmp_path / "preset.toml", "--steps", "3", cwd=tmp_path)   # a preset has no arguments to forward
    assert res.returncode == 2 and "after --" not in res.stderr and "--steps" in res.stderr
