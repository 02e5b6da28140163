"""What every `mt` command shares: the Typer app, its exit codes and options, one-line failures,
and how a started run is followed (printed, --headless, or the dashboard)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

app = typer.Typer(
    name="mt",
    help="Launch, watch, diagnose and recover PyTorch DDP training runs from one terminal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: importing rich's renderer costs ~0.3 s per call
    context_settings={"help_option_names": ["-h", "--help"]},
)

OK, RUN_FAILED, BAD_INPUT = 0, 1, 2

RunDirArg = Annotated[Path, typer.Argument(help="A run directory, e.g. runs/tiny-cpu-20260101-120000.", show_default=False)]
DetachOpt = Annotated[bool, typer.Option("--detach", help="Print the run directory and return; the run keeps going.")]
HeadlessOpt = Annotated[bool, typer.Option("--headless", help="No dashboard: print progress lines and exit with the run's result (SIGTERM stops the run gracefully; Ctrl-C only detaches).")]
EveryOpt = Annotated[Optional[float], typer.Option("--every", metavar="SECONDS", help="With --headless: at most one step line per SECONDS (default 1; 0: one per logged step); checkpoints, evals, incidents and attempts always get their line.", show_default=False)]
NprocOpt = Annotated[Optional[int], typer.Option("--nproc", help="Worker processes on this node (overrides launch.nproc_per_node).", show_default=False)]




def fail(message: str, code: int = BAD_INPUT) -> NoReturn:
    """One clear line on stderr, then exit with code (a path or reason from a run shown safely)."""
    from tui.format.fmt import safe_text

    typer.echo(f"mt: {safe_text(message, lines=True)}", err=True)
    raise typer.Exit(code)


def _not_terminals() -> str:
    """Which of stdin and stdout is not a terminal ('' when both are)."""
    return " and ".join(n for n, f in (("stdin", sys.stdin), ("stdout", sys.stdout)) if f is None or not f.isatty())


def _no_dashboard(headless: bool, instead: str = "following the run as with --headless") -> bool:
    """True for --headless, and (said in one line) when stdin or stdout is not a terminal: the
    dashboard would draw into a pipe and spin on a closed input."""
    why = "" if headless else _not_terminals()
    if why:
        typer.echo(f"mt: {why} not a terminal: no dashboard; {instead}", err=True)
    return headless or bool(why)


def every_s(every: float | None, headless: bool, detach: bool = False) -> float:
    """--every's seconds (1 when not given); exit 2 when negative, or when nothing would print the step
    lines it paces (--detach, --once, the dashboard on a terminal): an option is never silently dropped."""
    if every is None:
        return 1.0
    if not every >= 0:
        fail(f"--every: expected a number of seconds >= 0, got {every}")
    if detach or not (headless or _not_terminals()):
        fail("--every: only with --headless (it paces the step lines; the dashboard, --detach and --once print none)")
    return every


def _attach(run_dir: Path, detach: bool, headless: bool, every: float = 1.0,
            since: tuple[int, float] | None = None) -> None:
    """After starting a run: print it (--detach), follow it (--headless) or open the dashboard."""
    if detach:
        typer.echo(str(run_dir))
        return
    if _no_dashboard(headless):
        from tui.format.fmt import safe_text
        from tui.report.headless import follow_headless

        typer.echo(f"run dir: {safe_text(run_dir)}")
        raise typer.Exit(follow_headless(run_dir, sys.stdout, every_s=every, since=since))
    from tui.view.app import run_app

    raise typer.Exit(run_app(run_dir))
