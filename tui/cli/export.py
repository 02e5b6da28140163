"""`mt export`: a run's history as a TensorBoard log, CSV or Parquet."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tui.cli.common import RunDirArg, app, fail


@app.command()
def export(
    run_dir: RunDirArg,
    tensorboard: Annotated[Optional[Path], typer.Option("--tensorboard", metavar="DIR", help="Write a TensorBoard log into DIR (a new folder; tensorboard extra).", show_default=False)] = None,
    csv: Annotated[Optional[Path], typer.Option("--csv", metavar="FILE", help="Every step, eval, metrics line, system sample and incident as one CSV table (a kind column says which).", show_default=False)] = None,
    parquet: Annotated[Optional[Path], typer.Option("--parquet", metavar="FILE", help="The same table as Parquet (parquet extra: pyarrow).", show_default=False)] = None,
) -> None:
    """Export RUN_DIR (live or finished: what it holds now), every row, no sampling.

    Example:

    \b
        mt export runs/tiny-cpu-20260101-120000 --tensorboard tb/ --csv run.csv
    """
    from tui.mirror.export import ExportError, export_run

    try:
        for line in export_run(run_dir, tensorboard, csv, parquet):
            typer.echo(line)
    except ExportError as e:
        fail(str(e))
