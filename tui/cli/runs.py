"""`mt launch`, `mt watch`, `mt resume`, `mt ls`, `mt diff`: starting runs and looking at them."""
from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, Optional

import typer
from typer.core import TyperCommand

from tui.cli.common import OK, RUN_FAILED, DetachOpt, EveryOpt, HeadlessOpt, NprocOpt, _attach, _no_dashboard, app, every_s, fail

if TYPE_CHECKING:
    from tui.supervise.launch import Overrides


class _LaunchCommand(TyperCommand):
    """`mt launch`, whose unknown options after a script are most often the script's own, missing their `--`."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes the list it is given
        try:
            return super().parse_args(ctx, args)
        except Exception as e:
            # by name: typer 0.2x vendors its own click (typer._click), whose exceptions are not click's
            option = getattr(e, "option_name", None)
            script = next((a for a in given if a.endswith(".py") and not a.startswith("-")), None)
            if type(e).__name__ != "NoSuchOption" or not isinstance(option, str) or script is None:
                raise
            at = given.index(option) if option in given else len(given)
            fail(f"launch: no such option {option}: a script's own arguments go after --, "
                 f"as in: mt launch {script} -- {' '.join(given[at:])}")


@app.command(cls=_LaunchCommand)
def launch(
    preset: Annotated[Path, typer.Argument(metavar="PRESET", help="A TOML preset (presets/tiny-cpu.toml), or a training script of your own (train.py).", show_default=False)],
    script_args: Annotated[Optional[list[str]], typer.Argument(metavar="-- ARGS", help="Arguments for a script, after --.", show_default=False)] = None,
    detach: DetachOpt = False,
    headless: HeadlessOpt = False,
    every: EveryOpt = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Run name (overrides run.name).", show_default=False)] = None,
    runs_dir: Annotated[Optional[Path], typer.Option("--runs-dir", help="Where run directories go (overrides run.runs_dir).", show_default=False)] = None,
    nproc: NprocOpt = None,
    nnodes: Annotated[Optional[int], typer.Option("--nnodes", help="Nodes of the run (overrides launch.nnodes): with --slurm the nodes Slurm allocates; without it, each node runs mt launch with --node-rank K.", show_default=False)] = None,
    slurm: Annotated[bool, typer.Option("--slurm", help="Submit the run to Slurm (sbatch) instead of starting it here: [slurm] and [launch] nnodes/nproc_per_node (--nnodes, --nproc) give the allocation; prints the run directory and the job id and returns (--headless: follows the job until it ends).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --slurm: print the batch script and submit nothing (no run directory is made).")] = False,
    hang_timeout: Annotated[Optional[float], typer.Option("--hang-timeout", metavar="SECONDS", help="End an attempt this long after its hang verdict (its stacks kept): restart it from the newest checkpoint within max_restarts, else fail the run (overrides monitor.hang_timeout_s, default 300; 0: never).", show_default=False)] = None,
    node_rank: Annotated[Optional[int], typer.Option("--node-rank", help="This node's rank in a multi-node job (overrides launch.node_rank). Every node runs mt launch with the same preset and gets its own run dir (suffix -node<K>); the one that gets global rank 0 holds the events.", show_default=False)] = None,
) -> None:
    """Validate PRESET, create its run directory, start the run detached and open the dashboard.

    PRESET may be your own script (train.py): it runs on every rank under torchrun, and the
    mt library (mt.init, run.step) gives it plots, diagnosis and control. The run survives the
    viewer quitting and the terminal closing. Example:

    \b
        mt launch presets/tiny-cpu.toml --headless --nproc 2
        mt launch train.py --nproc 2 -- --lr 3e-4
    """
    from mt.contract.config import ConfigError
    from tui.supervise.launch import LaunchError, Overrides, launch_run

    over = Overrides(name=name, runs_dir=str(runs_dir) if runs_dir else None, nproc=nproc, nnodes=nnodes,
                     node_rank=node_rank, script_args=script_args or None, hang_timeout=hang_timeout)
    if dry_run and not slurm:
        fail("--dry-run: only with --slurm (it prints the batch script)")
    if slurm:
        follow = _slurm_follow(dry_run, detach, headless, node_rank)
        _launch_slurm(preset, over, dry_run, follow, every_s(every, follow, detach or dry_run or not follow))
    seconds = every_s(every, headless, detach)
    try:
        run_dir = launch_run(preset, over)
    except ConfigError as e:
        fail(str(e))
    except LaunchError as e:
        fail(str(e), RUN_FAILED)
    _attach(run_dir, detach, headless, seconds)


def _slurm_follow(dry_run: bool, detach: bool, headless: bool, node_rank: int | None) -> bool:
    """Whether `mt launch --slurm` follows the job (--headless); an option that cannot apply is refused."""
    if node_rank is not None:
        fail("--node-rank: not with --slurm (Slurm gives each node of the job its rank)")
    if dry_run and (detach or headless):
        fail(f"{'--detach' if detach else '--headless'}: not with --dry-run (it submits nothing to follow)")
    if detach and headless:
        fail("--detach and --headless: choose one (--detach returns at once, --headless follows the job)")
    return headless


def _launch_slurm(preset: Path, over: Overrides, dry_run: bool, follow: bool = False, every: float = 1.0) -> NoReturn:
    """`mt launch --slurm`: submit (or print the script) and return, or with `follow` (--headless)
    print the job's progress until it ends and exit with the run's code; the job runs the supervisor."""
    from mt.contract.config import ConfigError
    from tui.cluster.slurm import SlurmError
    from tui.supervise.submit import dry_run as script_for
    from tui.supervise.submit import launch_slurm

    try:
        if dry_run:
            typer.echo(script_for(preset, over), nl=False)
            raise typer.Exit(OK)
        sub = launch_slurm(preset, over)
    except (ConfigError, SlurmError) as e:
        fail(str(e))
    from tui.format.fmt import safe_text

    held = " (held: scontrol release it to start)" if sub.held else ""
    typer.echo(f"run dir: {safe_text(sub.run_dir)}\nslurm job: {safe_text(sub.job_id)}{held}")
    if follow:
        from tui.report.headless import follow_headless

        raise typer.Exit(follow_headless(sub.run_dir, sys.stdout, every_s=every))
    raise typer.Exit(OK)


MAX_COMPARED = 8   # runs one compare view overlays (colours that stay distinct)


@app.command()
def watch(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR...", help="A run directory, e.g. runs/tiny-cpu-20260101-120000; several (up to 8) open the compare view.", show_default=False)],
    once: Annotated[bool, typer.Option("--once", help="Print a plain-text summary and exit.")] = False,
    headless: Annotated[bool, typer.Option("--headless", help="No dashboard: print progress lines until the run ends and exit with its result (SIGTERM stops the run gracefully; Ctrl-C only detaches).")] = False,
    every: EveryOpt = None,
) -> None:
    """Open the dashboard on a live or finished run (--once: print a summary and exit;
    --headless: print progress lines until it ends). Several runs: their losses overlaid.

    Example:

    \b
        mt watch runs/tiny-cpu-20260101-120000 --once
        mt watch runs/tiny-cpu-20260101-120000 runs/tiny-cpu-20260101-130000
    """
    from tui.read.rundir import NotARunError, require_run_dir

    if len(run_dirs) > MAX_COMPARED:
        fail(f"{len(run_dirs)} runs: the compare view overlays at most {MAX_COMPARED}")
    try:
        for run_dir in run_dirs:
            require_run_dir(run_dir)
    except NotARunError as e:
        fail(str(e))
    seconds = every_s(every, headless, once or len(run_dirs) > 1)
    if len(run_dirs) > 1:
        _compare(run_dirs, once, headless)
    run_dir = run_dirs[0]
    if once:
        from tui.report.runs import run_summary

        typer.echo(run_summary(run_dir))
        return
    if _no_dashboard(headless):
        _attach(run_dir, False, True, seconds)
    from tui.view.app import run_app

    raise typer.Exit(run_app(run_dir))


def _compare(run_dirs: list[Path], once: bool, headless: bool) -> NoReturn:
    """`mt watch A B ...`: the overlay of their losses, or (--once) its header as text."""
    if headless:
        fail("--headless follows one run; give one RUN_DIR")
    once = once or _no_dashboard(False, "the compare table, as with --once")
    if once:
        from tui.report.runs import compare_table

        typer.echo(compare_table(run_dirs))
        raise typer.Exit(OK)
    from tui.view.compare import run_compare

    raise typer.Exit(run_compare(run_dirs))


@app.command()
def resume(
    run_dir: Annotated[Optional[Path], typer.Argument(help="The run to resume (default: the newest run under runs/).", show_default=False)] = None,
    nproc: NprocOpt = None,
    detach: DetachOpt = False,
    headless: HeadlessOpt = False,
    every: EveryOpt = None,
    from_scratch: Annotated[bool, typer.Option("--from-scratch", help="When no checkpoint is intact (or there is none), start again from step 0 instead of refusing; the damaged checkpoints are not deleted first.")] = False,
) -> None:
    """Start a new attempt of a stopped or failed run from its newest intact checkpoint.

    --nproc resumes on another number of workers (the global batch is kept). Example:

    \b
        mt resume runs/tiny-cpu-20260101-120000 --nproc 1 --headless
    """
    from tui.read.rundir import NotARunError, newest_run
    from tui.report.headless import resume_point
    from tui.supervise.launch import ResumeError, resume_run

    if run_dir is None:
        run_dir = newest_run(Path("runs"))
        if run_dir is None:
            fail("no run under runs/ to resume; name one: mt resume RUN_DIR")
    if nproc is not None and nproc < 1:
        fail(f"--nproc: expected an integer >= 1, got {nproc}")
    seconds = every_s(every, headless, detach)
    since = resume_point(run_dir)   # --headless prints only the new attempt's lines
    from mt.contract.config import ConfigError
    from mt.contract.status import read_status
    from tui.cluster.preempt import in_queue, record_gone, resubmit
    from tui.cluster.slurm import SlurmError

    try:
        record_gone(run_dir)   # a Slurm job that left the queue unrecorded: settled first (views only show it)
        queued = in_queue(run_dir)
        if queued and queued.waiting:   # already queued (submitted, or requeued): its job starts the next attempt
            typer.echo(queued.line)
            if headless:
                _attach(run_dir.resolve(), False, True, seconds, since)
            raise typer.Exit(OK)
        if queued:
            fail(queued.line)
        resume_run(run_dir, nproc, from_scratch)
        if read_status(run_dir).slurm_job_id:   # a Slurm run: sbatch again; the job starts the next attempt
            sub = resubmit(run_dir)
            typer.echo(f"run dir: {sub.run_dir}\nslurm job: {sub.job_id}")
            raise typer.Exit(0)
    except (NotARunError, ResumeError, SlurmError, ConfigError) as e:
        fail(str(e))
    _attach(run_dir.resolve(), detach, headless, seconds, since)


class LsSort(str, Enum):
    started = "started"
    loss = "loss"
    name = "name"


@app.command("ls")
def ls_runs(
    runs_dir: Annotated[Path, typer.Argument(help="Folder holding run directories.")] = Path("runs"),
    sort: Annotated[LsSort, typer.Option("--sort", help="started: newest first; loss: lowest best loss first; name.")] = LsSort.started,
) -> None:
    """List runs, newest first: name, state, attempt, step/max, last and best loss, started, duration.

    Example:

    \b
        mt ls runs --sort loss
    """
    from tui.report.runs import runs_table

    if not runs_dir.is_dir():
        fail(f"{runs_dir}: no such directory")
    typer.echo(runs_table(runs_dir, sort.value))


@app.command()
def diff(
    run_a: Annotated[Path, typer.Argument(metavar="RUN_A", help="A run directory.", show_default=False)],
    run_b: Annotated[Path, typer.Argument(metavar="RUN_B", help="Another run directory.", show_default=False)],
    first_divergence: Annotated[bool, typer.Option("--first-divergence", help="Also the first step whose logged values differ bit for bit, and the checkpoint tensors that differ around it.")] = False,
) -> None:
    """Compare two runs: the resolved config keys that differ, world size, final and best loss.

    Example:

    \b
        mt diff runs/tiny-cpu-20260101-120000 runs/tiny-cpu-20260101-130000
        mt diff RUN_A RUN_B --first-divergence
    """
    from tui.read.rundir import NotARunError, require_run_dir
    from tui.report.diff import DiffError, diff_text

    try:
        text = diff_text(require_run_dir(run_a), require_run_dir(run_b))
        if first_divergence:
            from tui.report.divergence import divergence_text
            text += "\n" + divergence_text(run_a, run_b)
        typer.echo(text)
    except (NotARunError, DiffError) as e:
        fail(str(e))
