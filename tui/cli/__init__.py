"""The `mt` command line: thin Typer wrappers over the packages below it (docs/map.md), one module per group of commands.

Exit codes: 0 success, 1 the run failed, 2 bad input. Heavy modules (psutil, Textual, the
dashboard) are imported inside the commands that need them, so `mt --help` stays instant;
torch is never imported here.
"""
from __future__ import annotations

from tui.cli import rollback, runs, steer, tools  # noqa: F401  (each registers its commands on the app; `mt --help` lists them in this order)
from tui.cli.common import BAD_INPUT, OK, RUN_FAILED, app, fail

__all__ = ["BAD_INPUT", "OK", "RUN_FAILED", "app", "fail", "main"]

from tui.cli import replay  # noqa: F401  (recovery, listed after the commands that start, steer and tool runs)


def main() -> None:
    """Console-script entry point."""
    app()
