"""`mt export RUN`: a run's history into TensorBoard, CSV or Parquet; every problem checked before anything is written."""
from __future__ import annotations

import os
from pathlib import Path

from mt.contract.paths import RunPaths
from tui.mirror import extra_hint, missing_extra
from tui.read.rundir import NotARunError, require_run_dir


class ExportError(Exception):
    """Bad input for `mt export`; str() is the one line for the user."""


def _check_file(flag: str, path: Path) -> None:
    if path.is_dir():
        raise ExportError(f"{flag} {path}: is a folder, not a file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ExportError(f"{flag} {path}: no such folder {parent}")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ExportError(f"{flag} {path}: cannot write there (permission denied)")


def _check_logdir(logdir: Path) -> None:
    from tui.mirror.tensorboard import has_event_files

    if logdir.exists() and not logdir.is_dir():
        raise ExportError(f"--tensorboard {logdir}: not a folder")
    if logdir.is_dir() and has_event_files(logdir):
        raise ExportError(f"--tensorboard {logdir}: already holds TensorBoard event files; export into a new folder")
    probe = next((p for p in (logdir, *logdir.parents) if p.exists()), Path("."))
    if not os.access(probe, os.W_OK):
        raise ExportError(f"--tensorboard {logdir}: cannot write there (permission denied)")


def export_run(run_dir: Path, tensorboard: Path | None, csv: Path | None, parquet: Path | None) -> list[str]:
    """Write each export asked for; returns a line per file written. ExportError on bad input."""
    if tensorboard is None and csv is None and parquet is None:
        raise ExportError("nothing to export: give --tensorboard DIR, --csv FILE or --parquet FILE")
    try:
        paths = RunPaths(require_run_dir(run_dir))
    except NotARunError as e:
        raise ExportError(str(e)) from None
    for flag, module, given in (("--tensorboard", "tensorboard", tensorboard), ("--parquet", "pyarrow", parquet)):
        if given is not None and missing_extra(module):
            raise ExportError(f"{flag}: {extra_hint(module)}")
    for flag, path in (("--csv", csv), ("--parquet", parquet)):
        if path is not None:
            _check_file(flag, path)
    if tensorboard is not None:
        _check_logdir(tensorboard)
    done = []
    try:
        if csv is not None or parquet is not None:
            from tui.mirror.table import run_rows, write_csv, write_parquet

            columns, rows = run_rows(paths)
            if csv is not None:
                write_csv(csv, columns, rows)
                done.append(f"{csv}: {len(rows)} rows")
            if parquet is not None:
                write_parquet(parquet, columns, rows)
                done.append(f"{parquet}: {len(rows)} rows")
        if tensorboard is not None:
            from tui.mirror.mirror import export_tensorboard

            tensorboard.mkdir(parents=True, exist_ok=True)
            export_tensorboard(paths, tensorboard)
            done.append(f"{tensorboard}: TensorBoard log (tensorboard --logdir {tensorboard})")
    except OSError as e:
        raise ExportError(f"{e.filename or 'export'}: cannot write ({e.strerror or e})") from None
    return done
