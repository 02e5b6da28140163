"""A run directory the library makes itself, for a script started by plain `python` or `torchrun`.

It has what `mt launch` would have written (config.json naming the script, preset.toml,
status.json), so `mt ls`, `mt watch`, `mt ckpt`, `mt stop` and `mt resume` work on it. With
no supervisor, rank 0's own pid stands in for one: the run is live while rank 0 lives.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from mt.agree import process_group
from mt.contract.config import Config, LaunchConfig, RunConfig
from mt.contract.jsonl import write_json_atomic
from mt.contract.paths import RunPaths, new_run_dir
from mt.contract.preset import script_run_name, write_script_preset
from mt.contract.space import ensure_reserve
from mt.contract.status import CLEAN_STATES, Status, read_status, save_status, write_status
from mt.failsafe import WriteFailures


def make_own_run(rank: int, world: int, name: str | None, runs_dir: Path,
                 failures: WriteFailures | None = None) -> RunPaths | None:
    """Rank 0 creates the run and tells the other ranks where it is (a broadcast); None on every
    rank when it cannot (a read-only folder, a full disk: said in `failures`, the script trains on)."""
    failures = failures or WriteFailures()
    made = None
    if rank == 0:
        with failures.guard(runs_dir):
            made = _create(world, name, runs_dir)
    return _share(made) if world > 1 else made


def _create(world: int, name: str | None, runs_dir: Path) -> RunPaths:
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] not in ("", "-c", "-m") else None
    base = script_run_name(name or (script.stem if script else "script"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cfg = Config(run=RunConfig(name=base, runs_dir=str(runs_dir), workdir=os.getcwd()),
                 launch=LaunchConfig(nproc_per_node=local, nnodes=max(1, world // max(1, local)),
                                     script=str(script or ""), script_args=list(sys.argv[1:])))
    paths = RunPaths(new_run_dir(runs_dir.expanduser(), base).resolve())
    try:
        _fill(paths, cfg, script)
    except OSError:
        shutil.rmtree(paths.root, ignore_errors=True)  # half a run directory would only confuse `mt ls`
        raise
    return paths


def _fill(paths: RunPaths, cfg: Config, script: Path | None) -> None:
    local = cfg.launch.nproc_per_node
    for sub in (paths.logs, paths.control, paths.checkpoints, paths.heartbeat_dir):
        sub.mkdir(mode=0o700, exist_ok=True)
    write_script_preset(paths.preset, cfg, "written by mt.init for a script started without mt launch")
    write_json_atomic(paths.config, cfg.recorded())
    now = time.time()
    write_status(paths, Status(
        state="running", attempt=1, supervisor_pid=os.getpid(), owner="script", worker_pids={"0": os.getpid()},
        started=now, reason="started without mt launch: rank 0 stands in for the supervisor",
        nproc=local, nnodes=cfg.launch.nnodes, node_rank=0, preset=str(script or ""),
        attempts=[{"attempt": 1, "started": now, "torchrun_pid": None, "ended": None, "exit_code": None}],
        owner_cmdline=_cmdline(),  # how `mt kill` knows the pid is still this run's rank 0
    ))
    ensure_reserve(paths.reserve)  # deleted to make room for the final status.json on a full disk


def _share(made: RunPaths | None) -> RunPaths | None:
    dist = process_group()
    if dist is None:
        raise RuntimeError("mt.init: with WORLD_SIZE > 1 outside `mt launch`, call it after "
                           "torch.distributed.init_process_group, so that every rank joins the same run directory")
    box: list[Any] = [str(made.root) if made else None]
    dist.broadcast_object_list(box, src=0)
    return RunPaths(Path(box[0])) if box[0] else None


def record_end(paths: RunPaths, state: str, reason: str) -> None:
    """The final state in status.json (rank 0, the stand-in supervisor)."""
    status = read_status(paths.root)
    if not status.by_script:
        return
    status.end(state, reason, time.time(), exit_code=0 if state in CLEAN_STATES else 1)
    save_status(paths, status)  # on a full disk it spends the reserve: what that is for
    paths.reserve.unlink(missing_ok=True)


def _cmdline() -> list[str]:
    """This process's command line as the kernel has it (what psutil reports), else sys.argv."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return [sys.executable, *sys.argv]
