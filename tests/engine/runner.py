"""Start real engine processes on small configs and read what they wrote."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from mt.contract.eventindex import HEADER, NEWEST_KINDS, RECORD, index_lines, index_path
from mt.contract.jsonl import read_events
from mt.contract.preset import config_from_dict

REPO = Path(__file__).resolve().parents[2]

SMALL: dict[str, Any] = {
    "run": {"name": "t", "seed": 7},
    "launch": {"nproc_per_node": 1, "device": "cpu", "pg_timeout_s": 60},
    "model": {"vocab_size": 64, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32},
    "data": {"source": "synthetic", "synthetic_samples": 512, "val_fraction": 0.0},
    "train": {"micro_batch_size": 4, "grad_accum_steps": 2, "max_steps": 12, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2},
    "checkpoint": {"every_steps": 0},
}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) for k, v in base.items()}
    for section, values in over.items():
        out.setdefault(section, {}).update(values)
    return out


def make_run(root: Path, name: str = "run", base: dict[str, Any] = SMALL, **sections: dict[str, Any]) -> Path:
    """A run directory holding a validated config.json built from `base` plus overrides."""
    run = root / name
    run.mkdir(parents=True)
    cfg = config_from_dict(merge(base, sections), "test")
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    return run


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def engine_cmd(run: Path, nproc: int, attempt: int) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "engine", "--run-dir", str(run), "--attempt", str(attempt)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "engine", "--run-dir", str(run), "--attempt", str(attempt)]


def start(run: Path, nproc: int = 1, attempt: int = 1, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the run in its own session (as the supervisor does), output to run/launcher.log."""
    log = open(run / f"launcher-{attempt}.log", "ab")
    return subprocess.Popen(engine_cmd(run, nproc, attempt), cwd=REPO, env={**_env(), **(env or {})}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def run_engine(run: Path, nproc: int = 1, attempt: int = 1, timeout: float = 240, env: dict[str, str] | None = None) -> int:
    return finish(start(run, nproc, attempt, env), run, timeout)


def finish(proc: subprocess.Popen, run: Path, timeout: float = 240) -> int:
    """The engine's exit code; past `timeout`, every rank's stack (SIGUSR2) goes into the failure."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:  # torchrun's workers, or the one engine process itself (SIGUSR2 would end torchrun)
            top = psutil.Process(proc.pid)
            ranks = [c for c in top.children(recursive=True) if "engine" in " ".join(c.cmdline())] or [top]
        except psutil.Error:
            ranks = []
        for rank in ranks:
            try:
                rank.send_signal(signal.SIGUSR2)  # the engine's faulthandler writes the stacks to its rank log
            except psutil.Error:
                pass
        time.sleep(2)
        kill_tree(proc.pid)
        raise AssertionError(f"engine did not finish in {timeout}s; logs (with each rank's stack): {logs(run)}") from None


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> list[int]:
    """Signal a process and every descendant (torchrun workers sit in their own process groups)."""
    try:
        parent = psutil.Process(pid)
        procs = [parent] + parent.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    return [p.pid for p in procs]


def wait_for(predicate, timeout: float = 120, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def events(run: Path, kind: str | None = None) -> list[dict[str, Any]]:
    evs = read_events(run / "events.jsonl")
    return [e for e in evs if kind is None or e["kind"] == kind]


def final_weights(run: Path) -> dict[str, Any]:
    """The model state dict of a run's last final checkpoint, of either layout (full or sharded)."""
    import torch

    from engine.checkpoint import sharded

    path = Path([c for c in events(run, "checkpoint") if c["reason"] == "final"][-1]["path"])
    if (path / "model.pt").exists():
        return torch.load(path / "model.pt", weights_only=True)
    return sharded.model_state(path)


def steps_by_attempt(run: Path) -> dict[int, list[dict[str, Any]]]:
    """Step events grouped by the attempt whose run_start preceded them."""
    out: dict[int, list[dict[str, Any]]] = {}
    attempt = 0
    for e in events(run):
        if e["kind"] == "run_start":
            attempt = e["attempt"]
        elif e["kind"] == "step":
            out.setdefault(attempt, []).append(e)
    return out


def logs(run: Path) -> str:
    parts = []
    for p in sorted(run.glob("logs/*.log")) + sorted(run.glob("launcher-*.log")):
        parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


def index_problem(events: Path) -> str | None:
    """None when events.idx is exactly the index a fresh read of events.jsonl would build."""
    data = events.read_bytes()
    raw = index_path(events).read_bytes()
    have, want = raw[HEADER.size:], index_lines(data, 0)
    if have == want:
        newest = {k: 0 for k in NEWEST_KINDS}
        for i, rec in enumerate(RECORD.iter_unpack(want), start=1):
            if rec[1] in newest:
                newest[int(rec[1])] = i
        header = list(HEADER.unpack(raw[:HEADER.size])[3:])
        return None if header == list(newest.values()) else f"newest of each kind {header} != {list(newest.values())}"
    for i in range(0, max(len(have), len(want)), RECORD.size):
        a, b = have[i:i + RECORD.size], want[i:i + RECORD.size]
        if a != b:
            return f"record {i // RECORD.size}: {RECORD.unpack(a) if len(a) == RECORD.size else a!r} != " \
                   f"{RECORD.unpack(b) if len(b) == RECORD.size else b!r}"
    return "?"
