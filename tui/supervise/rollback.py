"""`mt rollback` and the dashboard's `b`: stop the run if it is live, then continue it from an
earlier checkpoint with batches skipped and the learning rate scaled (docs/checkpoints.md#rollback).
Everything is checked before anything is touched: a bad step or scale changes nothing."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mt.contract import knobs
from mt.contract import rollback as contract
from mt.contract.checkpoints import newest, reported_at
from mt.contract.config import ConfigError
from mt.contract.events import INT_MAX
from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json
from mt.contract.records import IncidentLine, RecordTail, RollbackEvent, Step
from mt.contract.rollback import Rollback
from mt.contract.status import read_status
from tui.read.rundir import liveness, require_run_dir
from tui.supervise.control import ControlError, request_stop, wait_answer, wait_final
from tui.supervise.launch import ResumeError, resume_run

BAD_STEPS = ("nan_loss", "loss_spike")  # the incidents a default rollback goes back before


class RollbackError(ValueError):
    """A rollback that cannot be made; str() is the one line to show (nothing was changed)."""


@dataclass(frozen=True)
class Seen:
    """What the run's events say: the step it reached, and its newest NaN or spike (step, code)."""

    reached: int
    bad: tuple[int, str] | None
    rollbacks: int = 0   # the newest rollback event's count


def seen(paths: RunPaths) -> Seen:
    """One pass over events.jsonl (through the door, as every reader)."""
    reached, bad, count = 0, None, 0
    for rec in RecordTail(paths.events).iter_new():
        if isinstance(rec, Step):
            reached = max(reached, rec.step)
        elif isinstance(rec, IncidentLine) and rec.code in BAD_STEPS and rec.step is not None:
            bad = (rec.step, rec.code)
        elif isinstance(rec, RollbackEvent):
            count = max(count, rec.count or 0)
    return Seen(reached, bad, count)


def _checkpoints(paths: RunPaths, script: bool, at_most: int) -> tuple[list[int], str]:
    """The steps of the checkpoints at or before `at_most` a rollback could use, newest first (the
    engine's intact folders; a script's newest reported one that exists), and why none, if none."""
    if script:
        found = reported_at(paths.events, at_most)
        return ([found[1]] if found else []), " (the script reported none that still exists)"
    target = newest(paths.checkpoints, at_most=at_most)
    damaged = f" ({len(target.damaged)} damaged: {target.damaged[0].message})" if target.damaged else ""
    return ([target.step] if target.step is not None else []), damaged


def plan(run_dir: Path, to: int | None, skip: int | None, lr_scale: float | None) -> Rollback:
    """The rollback to make, every value checked, nothing written; RollbackError names what is wrong.

    Default `to`: the newest checkpoint before the newest NaN or spike incident, else the newest but
    one. Default `skip`: train.rollback_skip_batches, whose 0 skips every batch from the checkpoint
    through the bad (or reached) step."""
    run_dir = require_run_dir(Path(run_dir))
    paths = RunPaths(run_dir)
    try:
        cfg = load_config_json(paths.config)
    except ConfigError as e:
        raise RollbackError(str(e)) from None
    script = bool(cfg.launch.script)
    if lr_scale is not None:
        try:
            lr_scale = float(knobs.check("lr_scale", lr_scale))
        except knobs.KnobError as e:
            raise RollbackError(f"--lr-scale: {e}") from None
    if skip is not None and skip < 0:
        raise RollbackError(f"--skip-batches: expected a whole number >= 0, got {skip}")
    if to is not None and to < 0:
        raise RollbackError(f"--to: expected a step >= 0, got {to}")
    s = seen(paths)
    newest = _checkpoints(paths, script, INT_MAX)[0]
    reached = max(s.reached, *newest[:1])
    if to is not None:
        limit, why = to, f"to step {to} (mt rollback --to)"
    elif s.bad is not None:
        limit, why = s.bad[0] - 1, f"{s.bad[1]} at step {s.bad[0]}"
    else:
        limit, why = (newest[0] - 1 if newest else -1), "the newest checkpoint but one (no NaN or spike incident)"
    steps, none_why = _checkpoints(paths, script, limit)
    if not steps:
        raise RollbackError(f"{run_dir}: no intact checkpoint at or before step {limit} to roll back to{none_why}; "
                            f"nothing was changed")
    bad_step = s.bad[0] if s.bad is not None and to is None else reached
    batches = skip if skip is not None else contract.skip_for(cfg.train.rollback_skip_batches, bad_step, steps[0])
    return Rollback(reached, steps[0], batches, lr_scale, why, "user", max(contract.newest_count(paths), s.rollbacks) + 1)


def roll_back(run_dir: Path, rb: Rollback, stop_timeout: float = 300.0) -> str:
    """Stop the run if it is live (a checkpoint of the step it reached, set aside by the rollback),
    write the request and start the new attempt; returns what was done, in a line."""
    run_dir = Path(run_dir).resolve()
    status = read_status(run_dir)
    stopped = ""
    if liveness(status) == "live":
        try:
            rid = request_stop(run_dir)
        except ControlError as e:
            raise RollbackError(str(e)) from None
        if rid is not None and wait_answer(run_dir, rid, stop_timeout).status == "rejected":
            raise RollbackError(f"{run_dir}: the stop was rejected; nothing was rolled back")
        final = wait_final(run_dir, stop_timeout)
        if liveness(final) not in ("final", "lost"):
            raise RollbackError(f"{run_dir}: the run did not stop within {stop_timeout:g} s; nothing was rolled back")
        stopped = f"run {final.state}; "
    contract.write_request(RunPaths(run_dir), rb)
    try:
        resume_run(run_dir, rollback=True)
    except ResumeError as e:
        contract.clear_request(RunPaths(run_dir))
        raise RollbackError(str(e)) from None
    lr = f", lr scaled by {rb.lr_scale:g}" if rb.lr_scale is not None else ""
    return (f"{stopped}rolling back to the checkpoint of step {rb.to_step} ({rb.why}), skipping {rb.skip_batches} "
            f"batches{lr}: rollback {rb.count} of this run")
