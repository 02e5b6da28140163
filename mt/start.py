"""`mt.init`: join this process's run under `mt launch`, or make one (plain python or torchrun), once per process."""
from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from mt.contract.paths import RunPaths
from mt.facts import Facts
from mt.failsafe import WriteFailures
from mt.run import ENV_ATTEMPT, ENV_RUN_DIR, Run
from mt.stacks import install_stack_dump
from mt.started import Start

# this process's unfinished run, by pid (a forked child is not it): a second mt.init returns it
# rather than making a second run directory. A process has one run, as it has one sys.excepthook.
_LIVE: dict[int, Run] = {}


def init(config: Mapping[str, Any] | None = None, *, name: str | None = None, runs_dir: str | os.PathLike[str] = "runs",
         max_steps: int | None = None, precision: str | None = None, device: str | None = None,
         effective_batch: int | None = None, tokens_per_step: int | None = None, grad_clip: float | None = None,
         params_total: int | None = None, params_trainable: int | None = None) -> Run:
    """Join this process's mt run (under `mt launch`), or make one under `runs_dir` (plain python/torchrun).

    Call it on every rank; with several ranks outside `mt launch`, after init_process_group."""
    facts = Facts.of(precision=precision, device=device, effective_batch=effective_batch,
                     tokens_per_step=tokens_per_step, grad_clip=grad_clip, params_total=params_total,
                     params_trainable=params_trainable)
    if max_steps is None and config:
        guess = next((config[k] for k in ("max_steps", "max_iters") if k in config), None)
        max_steps = guess if isinstance(guess, int) and not isinstance(guess, bool) and guess > 0 else None
    live = _LIVE.get(os.getpid())
    if live is not None and not live._finished:
        live._describe(config, facts, max_steps)
        return live
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    joined = os.environ.get(ENV_RUN_DIR)
    failures = WriteFailures()
    if joined:
        paths, attempt, owned, usable = RunPaths.of_process(Path(joined)), int(os.environ.get(ENV_ATTEMPT) or 1), False, True
    else:
        from mt.ownrun import make_own_run
        made = make_own_run(rank, world, name, Path(runs_dir), failures)
        usable = made is not None
        paths, attempt, owned = made if made is not None else RunPaths(Path(runs_dir).absolute()), 1, True
    run = Run(Start(paths, rank, world, attempt, config, max_steps, owned, usable, failures, facts))
    from mt.rolledback import resume_point
    run.resume_from, run.rollback = resume_point(paths, usable)  # a pending `mt rollback`: an earlier checkpoint
    if run.rollback is not None:
        run.skip_batches, run.lr_scale = run.rollback.skip_batches, run.rollback.lr_scale
    run._previous_hook = sys.excepthook
    sys.excepthook = run._excepthook
    atexit.register(run._flush)  # a script that ends without run.finish() keeps its last steps
    install_stack_dump()  # what `mt stacks` reads from the rank log, as the engine's ranks have it
    _LIVE[os.getpid()] = run
    return run
