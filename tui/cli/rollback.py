"""`mt rollback`: continue a run from an earlier checkpoint, skipping batches, with the lr scaled."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from tui.cli.common import DetachOpt, HeadlessOpt, RunDirArg, _attach, app, fail


@app.command()
def rollback(
    run_dir: RunDirArg,
    to: Annotated[Optional[int], typer.Option("--to", metavar="STEP", help="Continue from the newest intact checkpoint at or before STEP (default: the newest before the newest NaN or spike incident, else the newest but one).", show_default=False)] = None,
    skip_batches: Annotated[Optional[int], typer.Option("--skip-batches", metavar="N", help="Skip the next N batches of the data order from there (default: train.rollback_skip_batches; its 0 skips every batch from the checkpoint through the bad step).", show_default=False)] = None,
    lr_scale: Annotated[Optional[float], typer.Option("--lr-scale", metavar="X", help="Scale the learning rate by X from there on (the lr_scale knob; default: as the checkpoint has it).", show_default=False)] = None,
    detach: DetachOpt = False,
    headless: HeadlessOpt = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for a live run to stop first.")] = 300.0,
) -> None:
    """Roll a run back: stop it if it is live, then continue it from an earlier checkpoint.

    The steps after that checkpoint are abandoned (their checkpoints are kept under
    checkpoints/abandoned/); the rollback is a `rollback` event and lives in every checkpoint after
    it, so a later resume follows the same path. Example:

    \b
        mt rollback runs/tiny-cpu-20260101-120000 --to 400 --skip-batches 200 --lr-scale 0.5
    """
    from tui.format.fmt import safe_text
    from tui.read.rundir import NotARunError
    from tui.report.headless import resume_point
    from tui.supervise.rollback import RollbackError, plan, roll_back

    since = resume_point(run_dir)   # --headless prints from here: the stop (if live), then the new attempt
    try:
        rb = plan(run_dir, to, skip_batches, lr_scale)
        line = roll_back(run_dir, rb, timeout)
    except (NotARunError, RollbackError) as e:
        fail(str(e))
    typer.echo(safe_text(line))
    _attach(run_dir.resolve(), detach, headless, since=since)
