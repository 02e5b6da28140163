"""Why an attempt failed, in the one line status.json `reason` keeps, and the failed workers a node reports."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from mt.contract import space
from mt.contract.config import Config, MonitorConfig
from mt.contract.paths import RunPaths
from mt.contract.records import RunEnd
from tui.diagnose.hang import HANG_ENDED
from tui.read.procs import run_processes
from tui.read.torchrun_log import read_failures
from tui.supervise.procs import terminate_all
from tui.supervise.torchrun import is_direct


def attempt_failure(cfg: Config, paths: RunPaths, rc: int, worker_rc: int | None, run_end: RunEnd | None,
                    elsewhere: str = "") -> str:
    """The reason: the engine's own run_end, else what the exit codes say; `elsewhere`: another
    node's rank that died of a signal (`rank 1 on node n2 was killed by signal 9`), the cause then."""
    if elsewhere:  # what this node saw followed from it
        return f"{elsewhere}; then {run_end.reason if run_end and run_end.reason else f'torchrun exited with code {rc}'}"
    if run_end and run_end.reason:
        return run_end.reason
    if is_direct(cfg):  # no torchrun ran: the one worker's own exit
        what = f"the script {Path(cfg.launch.script).name}" if cfg.launch.script else "the worker"
        why = f"{what} was killed by signal {-rc}" if rc < 0 else f"{what} exited with code {rc}"
        why += f"; see logs/{paths.rank_log(0).name}"
    elif worker_rc is not None and worker_rc < 0:
        why = f"a worker was killed by signal {-worker_rc} (torchrun exit {rc})"
    elif worker_rc is not None:
        why = f"a worker exited with code {worker_rc} (torchrun exit {rc}); see logs/"
    else:
        why = f"torchrun exited with code {rc}; see logs/torchrun.log"
    free = space.free_bytes(paths.root)
    if free is not None and free < space.RESERVE_BYTES:  # the engine could not even write its run_end
        why += f"; disk full: {space.describe(paths.root)}"
    return why


def failures_since(log_path: Path, offset: int) -> list[dict[str, Any]]:
    """This attempt's failed workers from torchrun's report, as status.json `failures` keeps them."""
    return [{"rank": f.rank, "exit_code": f.exit_code, "pid": f.pid} for f in read_failures(log_path, offset)]



HANG_GRACE_S = 5.0   # from SIGTERM to SIGKILL: a hung rank never acts on SIGTERM (it is stuck)


def hang_reason(rec: dict[str, Any], timeout_s: float) -> str:
    """status.json `reason` for an attempt ended on a hang verdict: the verdict, then its stacks' line."""
    ev = rec.get("evidence") or {}
    what = "; ".join(str(x) for x in (rec.get("title"), ev.get("verdict")) if x)
    return f"{HANG_ENDED} {timeout_s:g} s after the verdict ([monitor] hang_timeout_s): {what}"


def end_if_hung(incidents: Any, m: MonitorConfig, since: float, say: Callable[[str], None], paths: RunPaths,
                torchrun_pid: int) -> str | None:
    """A hang verdict of the attempt begun at `since`, [monitor] hang_timeout_s old (its stacks kept): say
    why (first, so the rules never read the ranks' end as a crash), end its processes, return the reason."""
    rec = incidents.overdue("hang", since, m.hang_timeout_s, time.time())
    if rec is None:
        return None
    reason = hang_reason(rec, m.hang_timeout_s)
    say(reason)
    procs = run_processes(paths.root, [torchrun_pid], node=paths.node)   # this node's: the supervisor's own ranks
    terminate_all([p for p in procs if p.pid != os.getpid()], grace_s=HANG_GRACE_S)
    return reason
