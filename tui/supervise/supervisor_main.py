"""The supervisor's process: its arguments, the run's lock taken first, daemonizing, and a crash
recorded in status.json: `python -m tui.supervise.supervisor_main --run-dir DIR [--daemon | --slurm]`
(tui/supervise/supervisor.py is the loop)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from mt.contract.paths import RunPaths
from tui.cluster.slurm import SlurmError, slurm_node
from tui.read.wait import poll_until
from tui.supervise import lock as runlock
from tui.supervise.procs import daemonize
from tui.supervise.replay import auto_replay
from tui.supervise.supervisor import Supervisor
from tui.supervise.supervisor import __doc__ as SUPERVISOR_DOC

KILL_CANCEL_WAIT_S = 30.0
"""How long a killed supervisor under Slurm waits for `mt kill`'s scancel before it ends its task."""


def await_cancel(sup: Supervisor) -> None:
    """`mt kill` of a Slurm job: USR1 (recorded `killed`, the ranks ended), then scancel. Ending this task
    first would end the job on its own (FAILED or COMPLETED) before scancel lands, so wait for the
    SIGTERM that scancel brings (stop_requested), at most KILL_CANCEL_WAIT_S."""
    poll_until(lambda: sup.stop_requested, KILL_CANCEL_WAIT_S, 0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tui.supervise.supervisor_main", description=SUPERVISOR_DOC)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--daemon", action="store_true", help="fork, print the pid and return")
    parser.add_argument("--slurm", action="store_true",
                        help="inside a Slurm job (srun task): stay in the foreground, a child of the task Slurm tracks and signals")
    parser.add_argument("--lock-fd", type=int, help="the run's lock, taken by the caller and handed down")
    args = parser.parse_args(argv)
    os.umask(0o077)  # everything in a run directory is private to its owner, like the folder
    try:  # before anything else: a second supervisor must not touch the run (or its node's files)
        node = slurm_node(os.environ) if args.slurm else None
        if args.lock_fd is not None:
            runlock.adopt(args.run_dir, args.lock_fd, "a starting supervisor")
            lock = args.lock_fd
        else:
            lock = runlock.acquire(args.run_dir, "a starting supervisor", node=node)
    except (runlock.RunBusy, SlurmError, OSError) as e:
        print(f"mt supervisor: {e}", file=sys.stderr)
        return 2
    if args.daemon and not args.slurm:
        daemonize(RunPaths(args.run_dir).supervisor_log)
    runlock.note_holder(lock, f"supervisor pid {os.getpid()}")
    sup = Supervisor(args.run_dir, slurm=args.slurm)
    try:
        code = sup.run()
        if args.slurm and sup.kill_requested:
            await_cancel(sup)
        elif sup.cfg.monitor.replay_on_nan and not sup.lost:
            auto_replay(sup.run_dir, sup.cfg, sup.log)  # the run has ended: its GPUs are free for the replay
        return code
    except Exception:
        sup.log.exception("supervisor crashed")
        try:
            sup.status.ended, sup.status.reason = time.time(), "supervisor crashed; see logs/supervisor.log"
            sup.write_status("failed")
        except OSError:
            sup.log.exception("cannot record the crash in status.json")
        return 1


if __name__ == "__main__":
    sys.exit(main())
