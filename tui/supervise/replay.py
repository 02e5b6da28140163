"""`mt replay RUN [--step S]`: the run's steps from the newest intact checkpoint before S, again, in
processes of its own under RUN/replay/step-S/ (a run directory of its own: config, logs, events),
with hooks on every module (engine/replay.py); then report.json and report.txt there.

The run's own checkpoints, events and status are only read (through the door); the checkpoint the
replay starts from is hard-linked into its folder (copied where a link cannot be made), never moved.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mt.contract import checkpoints, door
from mt.contract.config import Config, ConfigError
from mt.contract.events import as_float
from mt.contract.incident import IncidentLine
from mt.contract.jsonl import write_json_atomic
from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json
from mt.contract.records import Checkpoint, RunStart, Step, read_records
from mt.contract.status import read_status
from tui.read.replay import REPLAY_CODES, ReplayReport, replay_dir
from tui.read.rundir import liveness
from tui.supervise.procs import die_with_parent
from tui.supervise.torchrun import attempt_command, is_direct, worker_env

FINDINGS_BYTES = 1 << 20
SPIKE_HISTORY = 3
"""A spike's replay starts this many steps before it where a checkpoint allows: its norms need a median."""


class ReplayError(ValueError):
    """Input a replay cannot use; str() is the one line for the user (exit 2)."""


class ReplayFailed(RuntimeError):
    """The replay's processes ended without findings; str() names its log."""


@dataclass(frozen=True)
class Plan:
    """What a replay runs: to `step`, from `checkpoint` (its step `from_step`), as `attempt` ran, on `world_size`."""

    run_dir: Path
    step: int
    code: str | None
    checkpoint: Path
    from_step: int
    attempt: int
    world_size: int
    original: dict[int, float]      # the run's logged losses of the replayed steps
    original_s: float | None        # the run's seconds from that checkpoint to step S
    cfg: Config

    @property
    def folder(self) -> Path:
        return replay_dir(self.run_dir) / f"step-{self.step}"


def plan_replay(run_dir: Path, step: int | None) -> Plan:
    """Check the input and choose the checkpoint; ReplayError (one line) when it cannot be replayed."""
    paths = RunPaths(Path(run_dir))
    try:
        cfg = load_config_json(paths.config)
    except ConfigError as e:
        raise ReplayError(str(e)) from None
    if cfg.launch.script:
        raise ReplayError(f"{run_dir}: a script's run ([launch] script): mt replay replays mt's engine only")
    if liveness(read_status(paths.root)) in ("live", "starting", "pending"):
        raise ReplayError(f"{run_dir}: the run is live: replay it once it has ended (mt stop), never beside it on its devices")
    records = read_records(paths.events)
    incidents = [r for r in records if isinstance(r, IncidentLine) and r.code in REPLAY_CODES and r.step]
    code = None
    if step is None:
        if not incidents:
            raise ReplayError(f"{run_dir}: no NaN or spike incident in events.jsonl: give the step with --step S")
        step, code = incidents[-1].step, incidents[-1].code
    else:
        code = next((i.code for i in reversed(incidents) if i.step == step), None)
    last = max([r.step for r in records if isinstance(r, (Step, IncidentLine)) and r.step] or [0])
    if step < 1 or step > last:
        raise ReplayError(f"--step {step}: past the run (its last step is {last})" if step > last else
                          f"--step {step}: expected a step >= 1")
    attempt, world = _attempt_of(records, step)
    checkpoint, from_step = _checkpoint_before(paths, step, code)
    original, original_s = _original(records, attempt, from_step, step)
    return Plan(Path(run_dir), step, code, checkpoint, from_step, attempt, world or cfg.world_size, original, original_s, cfg)


def _attempt_of(records: list[Any], step: int) -> tuple[int, int | None]:
    """The attempt that ran `step` (the newest that logged it) and its world size."""
    attempt, world, found = 1, None, (1, None)
    for r in records:
        if isinstance(r, RunStart):
            attempt, world = r.attempt or attempt, r.world_size
        elif isinstance(r, (Step, IncidentLine)) and r.step == step:
            found = (attempt, world)
    return found


def _checkpoint_before(paths: RunPaths, step: int, code: str | None) -> tuple[Path, int]:
    """The newest intact checkpoint before `step`; but SPIKE_HISTORY steps before it where there is one,
    unless the step is a NaN's (a spike's norms, or a step --step named, need a median of earlier steps)."""
    for at_most in ([step - 1] if code == "nan_loss" else [step - SPIKE_HISTORY, step - 1]):
        found = checkpoints.newest(paths.checkpoints, at_most=at_most)
        if found.path is not None and found.step is not None:
            return found.path, found.step
    raise ReplayError(f"{paths.checkpoints}: no intact checkpoint before step {step} to replay from")


def _original(records: list[Any], attempt: int, start: int, step: int) -> tuple[dict[int, float], float | None]:
    """The losses the run logged for steps start+1..step (the newest attempt up to `attempt` that ran
    each), and the seconds it took from the checkpoint at `start` to step `step`."""
    losses: dict[int, float] = {}
    now, t_from, t_to = 1, None, None
    for r in records:
        if isinstance(r, RunStart):
            now = r.attempt or now
            if now <= attempt and r.start_step == start:
                t_from = r.t
        if now > attempt:
            break
        if isinstance(r, Checkpoint) and r.step == start:
            t_from = r.t
        elif isinstance(r, Step) and start < r.step <= step and r.loss is not None:
            losses[r.step] = r.loss
        elif isinstance(r, IncidentLine) and r.code == "nan_loss" and r.step and start < r.step <= step and "loss" in r.evidence:
            losses.setdefault(r.step, as_float(r.evidence["loss"]))   # on_nan = "stop": the NaN step logs no step event
        if isinstance(r, (Step, IncidentLine)) and r.step == step and now == attempt:
            t_to = r.t
    seconds = t_to - t_from if t_from is not None and t_to is not None and t_to >= t_from else None
    return losses, seconds


def replay_config(plan: Plan) -> Config:
    """The run's config for its replay: the attempt's world size on one node, no checkpoints and
    none of the faults that end a process (the ones that change values stay: they are what happened)."""
    cfg = copy.deepcopy(plan.cfg)
    cfg.run.name = f"{cfg.run.name}-replay-{plan.step}"
    cfg.launch.nproc_per_node, cfg.launch.nnodes, cfg.launch.node_rank = plan.world_size, 1, 0
    cfg.checkpoint.every_steps = 0
    f = cfg.faults
    f.crash_at_step = f.hang_at_step = f.stall_at_step = f.crash_in_checkpoint_at_step = f.fail_checkpoint_at_step = 0
    f.hang_at_exit, f.stall_seconds, f.step_sleep_s, f.slow_checkpoint_s = False, 0.0, 0.0, 0.0
    return cfg


def prepare(plan: Plan) -> Config:
    """RUN/replay/step-S/ made afresh: its folders, its config.json and the checkpoint, linked."""
    folder = plan.folder
    if folder.is_symlink():
        raise ReplayError(f"{folder}: a link, not mt's replay folder")
    if folder.exists():
        shutil.rmtree(folder)  # an earlier replay to this step: ours to replace
    folder.parent.mkdir(mode=0o700, exist_ok=True)
    folder.mkdir(mode=0o700)
    paths = RunPaths(folder)
    for sub in (paths.logs, paths.control, paths.checkpoints, paths.heartbeat_dir):
        sub.mkdir(mode=0o700)
    dest = paths.checkpoints / plan.checkpoint.name
    dest.mkdir(mode=0o700)
    for name in [*checkpoints.read_manifest(plan.checkpoint)["files"], "manifest.json"]:
        try:
            os.link(plan.checkpoint / name, dest / name, follow_symlinks=False)
        except OSError:  # another filesystem: a copy (the run's file is never written either way)
            try:
                shutil.copyfile(plan.checkpoint / name, dest / name, follow_symlinks=False)  # refuses a FIFO
            except OSError as e:
                raise ReplayError(f"{plan.checkpoint / name}: cannot be linked or copied into {dest}: {e}") from None
    cfg = replay_config(plan)
    write_json_atomic(paths.config, cfg.recorded())
    return cfg


def run_replay(plan: Plan) -> tuple[dict[str, Any], Path]:
    """Replay, then write report.json and report.txt in its folder; (report, report.txt's path)."""
    cfg = prepare(plan)
    folder, started = plan.folder, time.time()
    cmd = attempt_command(cfg, folder, plan.attempt) + ["--replay-to", str(plan.step)]
    store = socket.create_server(("127.0.0.1", 0), backlog=256) if is_direct(cfg) else None
    log = RunPaths(folder).logs / "replay.log"
    with os.fdopen(door.open_append(log), "ab") as out:
        out.write(f"replay: {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=worker_env(cfg, store=store, attempt=plan.attempt), preexec_fn=die_with_parent,
                                    close_fds=True, pass_fds=(store.fileno(),) if store else ())
            rc = proc.wait()
        finally:
            if store is not None:
                store.close()
    findings = door.read_json(folder / "findings.json", FINDINGS_BYTES)
    if not isinstance(findings, dict):
        raise ReplayFailed(f"the replay ended (exit {rc}) without findings: see {RunPaths(folder).rank_log(0)}")
    report = compose(plan, findings, time.time() - started)
    write_json_atomic(folder / "report.json", report)
    text = folder / "report.txt"
    with os.fdopen(door.open_own(text, os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as f:
        f.write(report_text(plan, report))
    return report, text


def compose(plan: Plan, findings: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The engine's findings, with the run's losses compared bit for bit and the times."""
    replayed = {int(k): as_float(v) for k, v in (findings.get("losses") or {}).items() if str(k).isdigit()}
    common = sorted(set(replayed) & set(plan.original))
    diff = next((s for s in common if not _same(plan.original[s], replayed[s])), None)
    return {
        **findings, "run_dir": str(plan.run_dir), "code": plan.code, "checkpoint": str(plan.checkpoint),
        "from_step": plan.from_step, "attempt": plan.attempt, "compared": len(common),
        "reproduced": (diff is None) if common else None,
        "difference": None if diff is None else {"step": diff, "original": plan.original[diff], "replay": replayed[diff]},
        "replay_s": seconds, "original_s": plan.original_s,
    }


def _same(a: float, b: float) -> bool:
    """Bit for bit, as far as a logged float says: equal, or both NaN."""
    return a == b or (math.isnan(a) and math.isnan(b))


def auto_replay(run_dir: Path, cfg: Config, log: logging.Logger) -> None:
    """[monitor] replay_on_nan, by the supervisor once its run has ended: a replay to the newest NaN
    incident's step, if there is one; whatever stops it is a line in the supervisor's log, never its exit."""
    if cfg.launch.nnodes > 1 or cfg.launch.script:
        log.info("replay_on_nan: not for a run of several nodes or a script's run (mt replay RUN on one node)")
        return
    nans = [r.step for r in read_records(RunPaths(run_dir).events) if isinstance(r, IncidentLine) and r.code == "nan_loss" and r.step]
    if not nans:
        return
    try:
        plan = plan_replay(run_dir, nans[-1])
        log.info("replay_on_nan: replaying to step %d from %s", plan.step, plan.checkpoint)
        report, text = run_replay(plan)
    except (ReplayError, ReplayFailed, OSError) as e:
        log.warning("replay_on_nan: %s", e)
        return
    log.info("replay_on_nan: %s", door.read_text(text, 64 * 1024).strip())


def report_text(plan: Plan, report: dict[str, Any]) -> str:
    """report.txt, which `mt replay` prints."""
    parsed = ReplayReport.of(report)
    took = f"{report['replay_s']:.1f} s"
    if plan.original_s:
        took += f" (the run took {plan.original_s:.1f} s from that checkpoint to step {plan.step})"
    lines = [
        f"replay of {plan.run_dir} to step {plan.step}{f' ({plan.code} incident)' if plan.code else ''}",
        f"  from {plan.checkpoint.name} (step {plan.from_step}), world size {plan.world_size}, attempt {plan.attempt}: {took}",
        f"cause: {parsed.cause() if parsed else 'no findings'}",
        parsed.reproduction() if parsed else "losses: not compared",
        f"report: {plan.folder / 'report.json'}",
    ]
    return "\n".join(lines) + "\n"
