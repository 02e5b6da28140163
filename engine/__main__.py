"""`python -m engine --run-dir DIR --attempt N`: what torchrun starts on every rank."""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from engine import exit_now, guard_exit
from mt.contract.config import Config, ConfigError
from mt.contract.eventlog import EventWriter
from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json

if TYPE_CHECKING:
    from engine.data import Splits
    from engine.dist import DistEnv
    from mt.contract.inbox import StopSignals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--attempt", type=int, default=1)
    parser.add_argument("--replay-to", type=int, default=0, metavar="STEP",
                        help="mt replay: run from the folder's checkpoint to STEP with hooks on every module (engine/replay.py)")
    args = parser.parse_args(argv)
    paths = RunPaths.of_process(args.run_dir)   # a rank's heartbeat and log go to its node's folder (MT_NODE)
    try:
        cfg = load_config_json(paths.config)
    except ConfigError as e:
        print(f"mt engine: {e}", file=sys.stderr)
        return 2

    # torch is imported only past this point: a bad config answers fast
    from engine import dist
    from engine.data import DataError, build_splits
    from engine.dist import report_failure
    from engine.faults import Faults
    from engine.user import add_workdir
    from mt.contract.inbox import StopSignals
    from mt.contract.ranklog import redirect_output
    from mt.stacks import install_stack_dump

    rank = dist.read_env()[0]
    redirect_output(paths.rank_log(rank))
    install_stack_dump()  # `kill -USR2 PID` writes every thread's stack to this rank's log (mt stacks reads it)
    signals = StopSignals()
    signals.install()
    add_workdir(cfg)  # the user's factories are found where mt launch ran
    try:
        splits = build_splits(cfg)  # bad data is reported before any process group exists
    except DataError as e:
        dist.log(f"data error: {e}")
        if rank == 0:
            EventWriter(paths.events).emit("run_end", step=0, status="failed", reason=f"data error: {e}")
        return 2
    try:
        env = dist.init(cfg)
    except dist.DeviceError as e:  # every rank has the same verdict: rank 0 says it, no restart can change it
        dist.log(f"device check failed: {e}")
        if rank == 0:
            EventWriter(paths.events).emit("run_end", step=0, status="failed", reason=f"device check failed: {e}")
        return 2
    except Exception as e:  # noqa: BLE001 - any failure to join the group is reported, then exit 1
        dist.log(f"cannot start the process group: {report_failure(e)}")
        return 1
    code = 1
    try:
        code = _train(cfg, env, paths, args.attempt, splits, signals, args.replay_to)
        return code
    finally:
        guard_exit(code, cfg.launch.exit_grace_s)   # its work is done: this rank ends even if its shutdown hangs
        Faults(cfg.faults, rank, args.attempt).at_exit()
        dist.shutdown(clean=code == 0)


def _train(cfg: Config, env: DistEnv, paths: RunPaths, attempt: int, splits: Splits, signals: StopSignals,
           replay_to: int = 0) -> int:
    """The run on this rank; every way it can end becomes its run_end (rank 0) and an exit code."""
    from engine.dist import log, report_failure
    from engine.train import Trainer
    from engine.user import UserCodeError
    from engine.weights import InitFromError
    from mt.contract import space
    from mt.contract.attempt import ResumeRefused

    rank = env.rank
    trainer = None
    try:
        if replay_to:
            from engine.replay import ReplayTrainer

            trainer = ReplayTrainer(cfg, env, paths, attempt, splits, signals, until=replay_to)
        else:
            trainer = Trainer(cfg, env, paths, attempt, splits, signals)
        return trainer.train()
    except (ResumeRefused, UserCodeError, InitFromError) as e:
        why = f"resume refused: {e}" if isinstance(e, ResumeRefused) else str(e)
        if isinstance(e, UserCodeError) and e.__cause__ is not None:
            traceback.print_exception(e.__cause__)  # where in the user's code it raised, into the rank log
        log(why)
        if rank == 0:
            EventWriter(paths.events).emit("run_end", step=0, status="failed", reason=why)
        return 2  # the preset or the run directory has to change first: no restart
    except Exception as e:  # noqa: BLE001 - whatever ends the loop goes into run_end
        full = space.is_disk_full(e)
        reason = f"rank {rank}: {report_failure(e)}"
        if full and not isinstance(e, space.DiskFullError):
            reason = f"rank {rank}: disk full: {report_failure(e)}; {space.describe(paths.root)}"
        if rank == 0:
            try:
                events = trainer.events if trainer else EventWriter(paths.events)
                events.emit("run_end", step=trainer.step if trainer else 0, status="failed", reason=reason)
            except OSError as write_error:  # the disk may be too full for one line: the supervisor says so
                log(f"cannot write run_end: {write_error}")
        return 2 if full else 1  # 2: a restart would only fill the disk again


if __name__ == "__main__":
    exit_now(main())
