"""Helpers for the CLI tests: small presets, running `mt` as a real process, waiting, pids."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
MT = [sys.executable, "-m", "tui.cli"]

# Small enough that torchrun start-up dominates: a run of 20-40 steps takes seconds on 2 cores.
SMALL: dict[str, dict[str, Any]] = {
    "run": {"name": "t"},
    "launch": {"nproc_per_node": 2, "device": "cpu"},
    "model": {"vocab_size": 64, "n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 32},
    "train": {"micro_batch_size": 4, "max_steps": 24, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 2},
    "checkpoint": {"every_steps": 8},
}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # a sub-table such as [train.fsdp], inline
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return repr(v)


def toml_text(tables: dict[str, dict[str, Any]]) -> str:
    return "".join(
        f"[{name}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in table.items())
        for name, table in tables.items()
    )


def write_preset(path: Path, runs_dir: Path, **sections: dict[str, Any]) -> Path:
    """SMALL with per-section overrides (a value of None deletes the key)."""
    tables = {name: dict(table) for name, table in SMALL.items()}
    tables["run"]["runs_dir"] = str(runs_dir)
    for name, over in sections.items():
        table = tables.setdefault(name, {})
        for k, v in over.items():
            if v is None:
                table.pop(k, None)
            else:
                table[k] = v
    path.write_text(toml_text(tables))
    return path


def mt(*args: str, timeout: float = 240, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `mt ARGS` as a real process (same interpreter as the tests); `env` adds to the environment."""
    return run_cmd([*MT, *map(str, args)], timeout, cwd=cwd or REPO, env={"PYTHONUNBUFFERED": "1", **(env or {})})


def run_cmd(cmd: list[str], timeout: float, cwd: Path, env: dict[str, str] | None = None,
            runs_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    """subprocess.run; past `timeout` the test fails with what its runs were doing (status, log tails, stacks)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        out = _text(exc.stdout) + _text(exc.stderr)
        pytest.fail(f"{' '.join(cmd[-3:])} still running after {timeout:.0f} s\n{out}\n{hang_report(out, runs_dir)}")


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def hang_report(output: str, runs_dir: Path | None = None) -> str:
    """For a run that did not end: its status, each log's tail and py-spy stacks of its live processes."""
    dirs = [Path(w) for w in output.split() if w.startswith("/") and (Path(w) / "status.json").exists()]
    dirs += [d for d in (runs_dir.iterdir() if runs_dir and runs_dir.is_dir() else []) if d not in dirs]
    parts = []
    for run_dir in dirs:
        parts.append(f"== {run_dir}\nstatus: {json.dumps(status(run_dir))}")
        for log in sorted(run_dir.rglob("logs/*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"-- {log.relative_to(run_dir)}\n" + "\n".join(tail))
        parts += _stacks_of(run_dir)
    return "\n".join(parts)


def _stacks_of(run_dir: Path) -> list[str]:
    st = status(run_dir)
    pids = {p for p in (st.get("supervisor_pid"), st.get("torchrun_pid")) if isinstance(p, int)}
    for pid in list(pids):
        try:
            pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pids.discard(pid)
    spy = Path(sys.executable).parent / "py-spy"
    out = []
    for pid in sorted(pids):
        if not spy.exists():
            out.append(f"-- pid {pid}: no py-spy for its stack")
            continue
        try:
            res = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
            out.append(f"-- pid {pid} stack\n{res.stdout}{res.stderr}")
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append(f"-- pid {pid}: no stack ({e})")
    return out


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Poll cond() until it is truthy; fail the test with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def status(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def incidents(run_dir: Path, code: str) -> list[dict[str, Any]]:
    """Every record of incidents.jsonl with this code, opened and closed, in order."""
    try:
        lines = (run_dir / "incidents.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [r for r in map(json.loads, lines) if r.get("code") == code]


def events(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if kind is None or ev.get("kind") == kind:
            out.append(ev)
    return out


class PidTracker:
    """Every pid that ever belonged to a run, gathered while it runs (status, heartbeats,
    system samples and the live process tree), so a test can prove none is left."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.pids: dict[int, float] = {}  # pid -> create_time, so a reused pid is not blamed

    def _add(self, pid: Any) -> None:
        if isinstance(pid, int) and pid > 0 and pid not in self.pids:
            try:
                self.pids[pid] = psutil.Process(pid).create_time()
            except psutil.NoSuchProcess:
                pass

    def collect(self) -> int:
        st = status(self.run_dir)
        self._add(st.get("supervisor_pid"))
        self._add(st.get("torchrun_pid"))
        for pid in (st.get("worker_pids") or {}).values():
            self._add(pid)
        hb = self.run_dir / "heartbeat"
        for f in hb.glob("rank*") if hb.is_dir() else []:
            try:
                self._add(json.loads(f.read_text()).get("pid"))
            except (OSError, ValueError):
                pass
        for root in list(self.pids):
            try:
                for child in psutil.Process(root).children(recursive=True):
                    self._add(child.pid)
            except psutil.NoSuchProcess:
                pass
        return len(self.pids)

    def alive(self) -> list[int]:
        left = []
        for pid, created in self.pids.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        return left


def end_run(run_dir: Path) -> None:
    """Kill what a test's run left running: its supervisor's and torchrun's process trees."""
    from tests.engine.runner import kill_tree

    st = status(run_dir)
    for pid in (st.get("supervisor_pid"), st.get("torchrun_pid")):
        if isinstance(pid, int):
            kill_tree(pid)


def run_dir_from(stdout: str) -> Path:
    """The run directory `mt launch --detach` printed, or that `--headless` named."""
    for line in stdout.splitlines():
        line = line.removeprefix("run dir: ").strip()
        if line.startswith("/") and Path(line).is_dir():
            return Path(line)
    raise AssertionError(f"no run directory in output:\n{stdout}")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def launch_user_run(tmp_path: Path, nproc: int, data: dict[str, Any], monitor: dict[str, Any],
                    model: dict[str, Any] | None = None, max_steps: int = 400) -> Path:
    """`mt launch --detach` of the engine tests' user model (my_models, or `model`'s factory and args)
    on `data` (a my_data factory)."""
    from tests.engine.usercode import work_folder

    work = work_folder(tmp_path)
    preset = write_preset(
        tmp_path / "p.toml", tmp_path / "runs", run={"workdir": str(work)},
        launch={"nproc_per_node": nproc, "device": "cpu"}, train={"max_steps": max_steps, "eval_every": 0},
        checkpoint={"every_steps": 0}, monitor=monitor,
        model={"kind": "python", **(model or {"factory": "my_models:build", "args": {"vocab": 32, "hidden": 32, "dropout": 0.1}})},
        data={"source": "python", **data})
    res = mt("launch", preset, "--detach", "--name", "stk")
    assert res.returncode == 0, res.stdout + res.stderr
    return Path(res.stdout.strip())
