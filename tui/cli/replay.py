"""`mt replay`: a run's steps again, from the checkpoint before an incident, to name the module that broke."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from tui.cli.common import RUN_FAILED, RunDirArg, app, fail


@app.command()
def replay(
    run_dir: RunDirArg,
    step: Annotated[Optional[int], typer.Option("--step", metavar="S", help="Replay to step S (default: the newest NaN or spike incident's step).", show_default=False)] = None,
) -> None:
    """Re-run a run from its newest intact checkpoint before step S to S, in processes of its own, with
    hooks on every module; print the cause (report in RUN/replay/step-S/).

    Example:

    \b
        mt replay runs/tiny-cpu-20260101-120000 --step 42
    """
    from tui.format.fmt import safe_text
    from tui.read.rundir import NotARunError, require_run_dir
    from tui.supervise.replay import ReplayError, ReplayFailed, plan_replay, run_replay

    try:
        plan = plan_replay(require_run_dir(run_dir), step)
    except (NotARunError, ReplayError) as e:
        fail(str(e))
    typer.echo(safe_text(f"replaying {run_dir} from {plan.checkpoint.name} to step {plan.step} "
                         f"on {plan.world_size} process(es): {plan.folder}"), err=True)
    try:
        report, text = run_replay(plan)
    except ReplayFailed as e:
        fail(str(e), RUN_FAILED)
    from mt.contract import door

    typer.echo(safe_text(door.read_text(text, 64 * 1024), lines=True), nl=False)
