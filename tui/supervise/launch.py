"""Create a run directory from a preset and start its supervisor detached; resume a run.

Nothing is created until the preset is fully valid, and nothing is started until the run
directory is complete, so bad input leaves no trace.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mt.contract import door, fmt, space
from mt.contract import preset as presets
from mt.contract.attempt import ResumeRefused, attempt_config
from mt.contract.checkpoints import newest, reported
from mt.contract.config import Config, ConfigError
from mt.contract.jsonl import write_json_atomic
from mt.contract.paths import RunPaths, new_run_dir
from mt.contract.preset import check_paths, config_from_dict, load_config_json, load_preset, script_run_name, write_script_preset
from mt.contract.status import Status, read_status, write_status
from tui.mirror import check_extras
from tui.read.rundir import liveness, require_run_dir
from tui.supervise import lock as runlock
from tui.supervise import usercheck
from tui.supervise.devices import check_devices, device_warnings


class LaunchError(RuntimeError):
    """The run could not be created or started; str() is the one line for the user."""


class ResumeError(LaunchError):
    """The run cannot be resumed (still running, no checkpoint, bad world size, ...)."""


@dataclass
class Overrides:
    """Command-line values that win over the preset."""

    name: str | None = None
    runs_dir: str | None = None
    nproc: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    script_args: list[str] | None = None
    """ARGS after `--`: for a script (they replace `[launch] script_args`)."""
    hang_timeout: float | None = None
    """`--hang-timeout`: [monitor] hang_timeout_s (a script has no preset to say it in)."""

    def flags(self) -> dict[str, str]:
        """The config key each given flag set -> the flag as typed (for errors: blame the flag)."""
        given = {"run.name": ("--name", self.name), "run.runs_dir": ("--runs-dir", self.runs_dir),
                 "launch.nproc_per_node": ("--nproc", self.nproc), "launch.nnodes": ("--nnodes", self.nnodes),
                 "launch.node_rank": ("--node-rank", self.node_rank), "monitor.hang_timeout_s": ("--hang-timeout", self.hang_timeout)}
        # a value with a control character is shown quoted and escaped: the error stays one line
        return {key: f"{flag} {json.dumps(value) if presets.control_char(str(value)) else value}"
                for key, (flag, value) in given.items() if value is not None}


def is_script(path: Path) -> bool:
    """`mt launch train.py`: a script of the user's own, not a preset."""
    return Path(path).suffix == ".py"


def _load(preset: Path) -> Config:
    """A preset, or for `train.py` the config of a script run named after it."""
    if not is_script(preset):
        return load_preset(preset)
    if not preset.is_file():
        raise ConfigError(str(preset), "", "no such script" if not preset.exists() else "not a file")
    return config_from_dict({"run": {"name": script_run_name(preset.stem)}, "launch": {"script": str(preset.resolve())}}, str(preset))


def resolve_config(preset: Path, over: Overrides, slurm: bool = False) -> tuple[Config, usercheck.UserCheck | None]:
    """Validate the preset with overrides applied and check its code (None: none); ConfigError names file and key."""
    presets.require_plain("mt launch", "PRESET", str(preset))   # it is written into preset.toml and status.json
    cfg = _load(Path(preset))
    raw = cfg.to_dict()
    source = str(preset)
    if over.script_args is not None:
        if not cfg.launch.script:
            raise ConfigError(source, "", f"arguments {' '.join(over.script_args)!r} are for a script "
                                          "(mt launch train.py -- ARGS, or [launch] script); this preset runs mt's engine")
        raw["launch"]["script_args"] = list(over.script_args)
    given = {("run", "name"): over.name, ("run", "runs_dir"): over.runs_dir, ("launch", "nproc_per_node"): over.nproc,
             ("launch", "nnodes"): over.nnodes, ("launch", "node_rank"): over.node_rank,
             ("monitor", "hang_timeout_s"): over.hang_timeout}
    for (table, key), value in given.items():
        if value is not None:   # a flag on the command line wins over the preset
            raw[table][key] = value
    if not raw["run"]["workdir"]:
        raw["run"]["workdir"] = os.getcwd()   # user factories are found where mt launch runs
    try:
        cfg = config_from_dict(raw, source)  # the overrides pass the same checks as the file
        check_paths(cfg, source)
        if not slurm:
            presets.require_rendezvous(cfg, source)
        check_extras(cfg, source)
        if not cfg.launch.script and not slurm:  # under Slurm each node's supervisor checks its own (supervisor.py)
            check_devices(cfg, source)
    except ConfigError as e:
        flag = over.flags().get(e.key)
        if flag is None:
            raise
        raise ConfigError(flag, e.key, e.message) from None  # the value came from the command line
    if cfg.launch.script:
        return cfg, None  # devices, models and data are the script's own business
    return cfg, usercheck.check_user_code(cfg, source)


# what a PrepareError is about -> the preset key to name
_PREPARE_KEYS = {"tokenizer": "data.tokenizer", "text": "data.path", "out": "run.runs_dir"}


def with_token_cache(cfg: Config, source: str, model_vocab: int | None = None) -> Config:
    """Text with a tokenizer: tokenize it once into `<runs_dir>/.tokens/` (or reuse what is there) and
    record the file in data.token_cache; ConfigError naming the key on a bad tokenizer or vocab.
    `model_vocab`: an hf model's vocab_size, from its config (the factory check builds it)."""
    d = cfg.data
    if d.source != "text" or not d.tokenizer:
        return cfg
    from tui.tools import prepare
    try:
        tok = prepare.load_tokenizer(d.tokenizer)
        vocab = prepare.vocab_size(tok)
        if cfg.model.kind != "hf" and cfg.model.vocab_size < vocab:
            raise ConfigError(source, "model.vocab_size", f"must be >= the vocab size of data.tokenizer ({vocab}), got {cfg.model.vocab_size}")
        if cfg.model.kind == "hf" and model_vocab is not None and model_vocab < vocab:
            key = "model.hf.path" if cfg.model.hf.get("path") else "model.hf.vocab_size"
            raise ConfigError(source, key, f"the model's vocab_size ({model_vocab}) is smaller than the vocab size of "
                                           f"data.tokenizer {d.tokenizer} ({vocab}); make vocab_size >= {vocab}")
        made = prepare.cached_tokens(d.path, tok, d.tokenizer, prepare.cache_dir(cfg.run.runs_dir))
    except prepare.PrepareError as e:
        raise ConfigError(source, _PREPARE_KEYS[e.what], e.message) from None
    return dataclasses.replace(cfg, data=dataclasses.replace(d, token_cache=str(made.path), token_dtype=made.dtype))


def _resume_token_cache(run_dir: Path, cfg: Config) -> Config:
    """The run's token cache, found (where config.json says, or beside the run) or made again from
    data.path and data.tokenizer when they still hash to its key; else a ResumeError saying how to fix it."""
    d = cfg.data
    if d.source != "text" or not d.tokenizer:
        return cfg
    from tui.tools import prepare
    recorded = Path(d.token_cache)
    here = prepare.cache_dir(run_dir.parent) / recorded.name  # the runs folder may have moved
    found = prepare.read_cache(recorded) or prepare.read_cache(here)
    if found is None:
        try:
            if prepare.cache_key(d.path, d.tokenizer) != recorded.stem:
                raise ResumeError(f"{run_dir}: the token cache {recorded} is gone and {d.path} or {d.tokenizer} changed "
                                  f"since launch, so it cannot be made again; put them back as they were, or launch a new run")
            found = prepare.build_cache(d.path, prepare.load_tokenizer(d.tokenizer), d.tokenizer, here)
        except prepare.PrepareError as e:
            raise ResumeError(f"{run_dir}: cannot make the token cache {recorded} again: {e}") from None
    return dataclasses.replace(cfg, data=dataclasses.replace(d, token_cache=str(found.path), token_dtype=found.dtype))


def _check_runs_dir(runs_dir: Path, source: str) -> None:
    """The runs directory must be creatable and writable before anything is made in it."""
    probe = runs_dir
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(source, "run.runs_dir", f"not a directory: {probe}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(source, "run.runs_dir", f"cannot write to {probe}")


def create_run(preset: Path, over: Overrides, slurm: bool = False) -> Path:
    """Validate, then make the run directory with preset.toml, config.json and status.json."""
    preset = Path(preset)
    cfg, checked = resolve_config(preset, over, slurm)
    for warning in ([] if slurm else device_warnings(cfg)):  # this login node's devices are not the run's
        print(f"mt: warning: {warning}", file=sys.stderr)
    runs_dir = Path(cfg.run.runs_dir).expanduser()
    _check_runs_dir(runs_dir, str(preset))
    cfg = with_token_cache(cfg, str(preset), checked.model_vocab if checked else None)
    try:
        run_dir = new_run_dir(runs_dir, cfg.run.name, cfg.launch.node_rank).resolve()
    except OSError as e:
        raise ConfigError(str(preset), "run.runs_dir", f"cannot create a run in {runs_dir}: {e.strerror}") from None
    paths = RunPaths(run_dir)
    for sub in (paths.logs, paths.control, paths.checkpoints, paths.heartbeat_dir):
        sub.mkdir(mode=0o700)
    if is_script(preset):
        write_script_preset(paths.preset, cfg, f"mt launch {preset}")
    else:
        shutil.copyfile(preset, paths.preset)
        os.chmod(paths.preset, 0o600)
    write_json_atomic(paths.config, cfg.recorded())
    write_status(paths, Status(state="starting", attempt=0, started=time.time(), nproc=cfg.launch.nproc_per_node,
                               nnodes=cfg.launch.nnodes, node_rank=cfg.launch.node_rank,
                               preset=str(preset.resolve())))
    usercheck.remember(cfg, checked)
    return run_dir


def start_supervisor(run_dir: Path, lock_fd: int) -> int:
    """Start the run's supervisor in its own session, detached from us; returns its pid.

    `-P` keeps the working directory off sys.path: a user's own `tui/` there is not ours.
    It double-forks (`--daemon`) so it is nobody's child: it survives the viewer quitting, the
    terminal closing and the SSH connection dropping, and init reaps it. It inherits
    `lock_fd` (the run's lock, see tui.supervise.lock) and holds it until it exits.
    """
    paths = RunPaths(Path(run_dir))
    # 0600 like every file of the run, whatever this shell's umask (the supervisor appends to it)
    with os.fdopen(door.open_append(paths.supervisor_log), "ab") as log:
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "tui.supervise.supervisor_main", "--run-dir", str(run_dir), "--daemon",
             "--lock-fd", str(lock_fd)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, pass_fds=(lock_fd,),
            start_new_session=True, check=False, timeout=60,
        )
    out = proc.stdout.decode().strip()
    if proc.returncode != 0 or not out.isdigit():
        raise LaunchError(f"{run_dir}: the supervisor did not start; see {paths.supervisor_log}")
    pid = int(out)
    status = read_status(run_dir)
    if status.supervisor_pid is None:
        # so that `mt kill` right after launch finds it even before it writes status itself
        status.supervisor_pid = pid
        write_status(paths, status)
    return pid


def launch_run(preset: Path, over: Overrides) -> Path:
    """create_run + start_supervisor; a run whose supervisor failed to start is marked failed."""
    run_dir = create_run(preset, over)
    lock = runlock.acquire(run_dir, f"mt launch (pid {os.getpid()})")
    try:
        start_supervisor(run_dir, lock)
    except (LaunchError, OSError, subprocess.TimeoutExpired) as e:
        _mark_failed(run_dir, str(e))
        raise LaunchError(str(e)) from None
    finally:
        os.close(lock)  # the supervisor holds its own copy
    return run_dir


def _mark_failed(run_dir: Path, reason: str) -> None:
    status = read_status(run_dir)
    status.end("failed", reason, time.time(), status.exit_code)
    write_status(RunPaths(run_dir), status)


def resume_run(run_dir: Path, nproc: int | None = None, from_scratch: bool = False, rollback: bool = False) -> None:
    """Start a new detached attempt from the newest intact checkpoint (optionally on nproc workers);
    `from_scratch`: from step 0 when no checkpoint is intact (else that is a ResumeError);
    `rollback`: a completed run too (rollback.json says where the attempt starts)."""
    run_dir = require_run_dir(Path(run_dir)).resolve()
    try:
        lock = runlock.acquire(run_dir, f"mt resume (pid {os.getpid()})")
    except runlock.RunBusy as e:
        raise ResumeError(str(e)) from None
    except OSError as e:
        raise ResumeError(f"{run_dir}: cannot lock the run: {e.strerror}") from None
    try:
        _resume_locked(run_dir, nproc, lock, from_scratch, rollback)
    finally:
        os.close(lock)


def _resume_locked(run_dir: Path, nproc: int | None, lock: int, from_scratch: bool, rollback: bool = False) -> None:
    paths = RunPaths(run_dir)
    status = read_status(run_dir)
    if liveness(status) == "pending":
        raise ResumeError(f"{run_dir}: the run is still pending in Slurm (job {status.slurm_job_id}); it has not started")
    if liveness(status) == "live":
        raise ResumeError(f"{run_dir}: the run is still {status.state} (supervisor pid {status.supervisor_pid})")
    from tui.read.procs import run_processes  # psutil only here

    left = run_processes(run_dir)
    if left:
        raise ResumeError(f"{run_dir}: processes of the last attempt are still running "
                          f"({', '.join(str(p.pid) for p in left)}); wait for them or `mt kill` the run")
    if status.state == "completed" and not rollback:
        raise ResumeError(f"{run_dir}: the run already completed; nothing to resume")
    try:
        cfg = load_config_json(paths.config)
    except ConfigError as e:
        raise ResumeError(str(e)) from None
    if cfg.launch.script:
        _resume_script(run_dir, cfg, status, nproc, lock, from_scratch)
        return
    # as the engine picks (every file's sha256): refused exactly when it would find nothing to continue from
    found = newest(paths.checkpoints, "sha256")
    if found.path is None and not from_scratch:
        left = "; nothing was started or deleted" if found.damaged else ""
        raise ResumeError(f"{run_dir}: {found.why_none()}{left}; `mt resume --from-scratch` starts again from step 0")
    _check_room(paths, cfg.checkpoint.keep_last)
    try:
        new = attempt_config(cfg, found.manifest, nproc)
    except (ConfigError, ResumeRefused) as e:
        raise ResumeError(f"{run_dir}: {e}") from None
    new = _resume_token_cache(run_dir, new)
    if new != cfg:
        cfg = new
        _write_or_refuse(paths, paths.config, cfg.recorded())
    _start_attempt(paths, status, f"resuming from {found.path.name}" if found.path else "starting again from step 0 (--from-scratch)",
                   cfg.launch.nproc_per_node, lock)


def _resume_script(run_dir: Path, cfg: Config, status: Status, nproc: int | None, lock: int, from_scratch: bool) -> None:
    """A script's run goes on from the newest checkpoint it reported (`run.checkpoint_saved`)."""
    paths = RunPaths(run_dir)
    ckpt = reported(paths.events)
    if ckpt is None and not from_scratch:
        raise ResumeError(f"{run_dir}: no checkpoint to resume from (the script never reported one with "
                          f"run.checkpoint_saved, or the files it named are gone)")
    if nproc is not None and nproc != cfg.launch.nproc_per_node:
        cfg = dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, nproc_per_node=nproc))
        _write_or_refuse(paths, paths.config, cfg.recorded())
    status.owner = None  # from here on a supervisor owns it, even if mt.init made it
    _start_attempt(paths, status, f"resuming from {ckpt}" if ckpt else "starting the script again (--from-scratch)",
                   cfg.launch.nproc_per_node, lock)


def _start_attempt(paths: RunPaths, status: Status, reason: str, nproc: int, lock: int) -> None:
    status.move("starting", reason)
    status.supervisor_pid, status.ended, status.exit_code, status.nproc = None, None, None, nproc
    _write_or_refuse(paths, paths.status, status.to_dict())
    if status.slurm_job_id:  # a Slurm run goes back to Slurm: the caller submits it (tui.cluster.preempt.resubmit)
        return
    try:
        start_supervisor(paths.root, lock)
    except (LaunchError, OSError, subprocess.TimeoutExpired) as e:
        _mark_failed(paths.root, str(e))
        raise ResumeError(str(e)) from None


def _check_room(paths: RunPaths, keep_last: int) -> None:
    """Refuse a resume whose next checkpoint would not fit (saying what to free where)."""
    # no process of the run is alive (checked before): a writer's leftovers are only garbage
    space.clean_temporaries(paths.checkpoints)
    reserve = 0 if paths.reserve.exists() else space.RESERVE_BYTES  # the supervisor makes it first
    room = space.plan_room(paths.checkpoints, None, keep_last, reserve)
    if room.fits or room.free is None or room.needed is None:
        return
    gained = sum(space.disk_usage(p) for p in room.prune_first)
    short = room.needed - room.free - gained
    raise ResumeError(f"{paths.root}: disk full, the next checkpoint would not fit: "
                      f"{space.describe(paths.checkpoints, room.needed)}; free at least {fmt.human_bytes(short)} "
                      f"on {space.mount_point(paths.checkpoints)} (other files, old runs, older checkpoints), "
                      f"then run mt resume again")


def _write_or_refuse(paths: RunPaths, path: Path, obj: object) -> None:
    """write_json_atomic; a full disk is a ResumeError saying where (the old file stays whole)."""
    try:
        write_json_atomic(path, obj)
    except OSError as e:
        if not space.is_disk_full(e):
            raise ResumeError(f"{path}: cannot write: {e.strerror or e}") from None
        raise ResumeError(f"{paths.root}: disk full: cannot write {path.name}; {space.describe(paths.root)}; "
                          f"free space there, then run mt resume again") from None
