"""`mt ckpt`, `mt set`, `mt stop`, `mt kill`, `mt stacks`: acting on a live run from outside."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from tui.cli.common import RUN_FAILED, RunDirArg, app, fail

if TYPE_CHECKING:
    from tui.state.answers import ControlAnswer

def _ask(run_dir: Path, action: str, timeout: float, settings: dict[str, float | int] | None = None) -> tuple[str, ControlAnswer]:
    """Send a control request and wait for the engine's answer; a run that cannot take one fails."""
    from tui.read.rundir import NotARunError
    from tui.supervise.control import ControlError, send_request, wait_answer

    try:
        request_id = send_request(run_dir, action, settings)
    except (NotARunError, ControlError) as e:
        fail(str(e))
    return request_id, wait_answer(run_dir, request_id, timeout)


@app.command()
def ckpt(
    run_dir: RunDirArg,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the engine's answer.")] = 120.0,
) -> None:
    """Ask a live run for a checkpoint now and wait for the engine's answer.

    Example:

    \b
        mt ckpt runs/tiny-cpu-20260101-120000
    """
    request_id, answer = _ask(run_dir, "checkpoint", timeout)
    if answer.status == "timeout":
        fail(f"{run_dir}: no answer to {request_id} within {timeout:g} s", RUN_FAILED)
    from tui.format.fmt import safe_text
    from tui.report.runs import answer_line

    typer.echo(safe_text(answer_line(answer)))
    if answer.status != "done":
        raise typer.Exit(RUN_FAILED)


@app.command(name="set")
def set_knobs(
    run_dir: RunDirArg,
    settings: Annotated[list[str], typer.Argument(metavar="KEY=VALUE...", help="lr_scale, grad_clip, eval_every, checkpoint_every, log_every, skip_batches.", show_default=False)],
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the engine's answer.")] = 120.0,
) -> None:
    """Turn knobs of a live run: every rank applies them from the same step; checkpoints keep them.

    skip_batches=N skips the next N batches of the data order once. Example:

    \b
        mt set runs/tiny-cpu-20260101-120000 lr_scale=0.5 skip_batches=20
    """
    from mt.contract.knobs import KnobError, parse_settings

    try:
        checked = parse_settings(settings)   # every one checked before anything is written
    except KnobError as e:
        fail(f"mt set: {e}")
    request_id, answer = _ask(run_dir, "set", timeout, checked)
    if answer.status == "timeout":
        fail(f"{run_dir}: no answer to {request_id} within {timeout:g} s", RUN_FAILED)
    from tui.format.fmt import safe_text
    from tui.report.runs import answer_line

    typer.echo(safe_text(answer_line(answer)))
    if answer.status != "done":
        raise typer.Exit(RUN_FAILED)


@app.command()
def stop(
    run_dir: RunDirArg,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the run to stop.")] = 300.0,
) -> None:
    """Stop a live run gracefully: it finishes the step, writes a final checkpoint and exits.

    A Slurm run pending in the queue (submitted or requeued) has its job cancelled and is recorded stopped.

    Resume it later with `mt resume`. Example:

    \b
        mt stop runs/tiny-cpu-20260101-120000
    """
    from tui.cluster.preempt import record_gone, stop_pending
    from tui.cluster.slurm import SlurmError
    from tui.format.fmt import safe_text
    from tui.read.rundir import NotARunError
    from tui.report.runs import last_checkpoint_line
    from tui.supervise.control import ControlError, request_stop, wait_answer, wait_final

    t0 = time.monotonic()
    try:
        # a Slurm job that left the queue unrecorded is over: recorded now (views only show it)
        queued = record_gone(run_dir) or stop_pending(run_dir, timeout)   # a Slurm run waiting in the queue: its job is cancelled
        if queued is not None:
            typer.echo(safe_text(f"run {queued.state} ({queued.reason}); {last_checkpoint_line(run_dir)}"))
            return
        request_id = request_stop(run_dir)  # None: a script with no mt calls got SIGTERM instead
    except (NotARunError, ControlError, SlurmError) as e:
        fail(str(e))
    answer = wait_answer(run_dir, request_id, timeout) if request_id is not None else None
    if answer is not None and answer.status == "rejected":
        fail(f"stop rejected: {answer.detail}", RUN_FAILED)
    status = wait_final(run_dir, max(1.0, timeout - (time.monotonic() - t0)))
    state = status.state
    if state in ("failed", "killed"):  # e.g. no room for the final checkpoint: say why
        fail(f"{run_dir}: the run ended {state}: {status.reason}", RUN_FAILED)
    if not status.ended_well:
        fail(f"{run_dir}: the run did not stop within {timeout:g} s (state {state})", RUN_FAILED)
    typer.echo(safe_text(f"run {state}; {last_checkpoint_line(run_dir)}"))


@app.command()
def kill(
    run_dir: RunDirArg,
    grace: Annotated[float, typer.Option("--grace", help="Seconds between SIGUSR1 and SIGKILL.")] = 10.0,
) -> None:
    """End every process of a run at once (SIGUSR1, then SIGKILL after --grace seconds).

    No rank saves a checkpoint: the newest one stays the one before the kill. `mt stop` ends a
    run with a checkpoint. Example:

    \b
        mt kill runs/tiny-cpu-20260101-120000 --grace 5
    """
    from tui.format.fmt import safe_text
    from tui.read.rundir import NotARunError
    from tui.supervise.control import ControlError, kill_run, kill_summary

    try:
        result = kill_run(run_dir, grace)
    except (NotARunError, ControlError) as e:
        fail(str(e))
    if result.survivors:
        fail(f"{run_dir}: processes still alive after SIGKILL: {result.survivors}", RUN_FAILED)
    typer.echo(safe_text(kill_summary(result)))


@app.command()
def stacks(
    run_dir: Annotated[Optional[Path], typer.Argument(help="A run directory, e.g. runs/tiny-cpu-20260101-120000.", show_default=False)] = None,
    pid: Annotated[Optional[int], typer.Option("--pid", help="Instead of a run: the torchrun agent's pid or any rank's (a job started without mt; read by py-spy).", show_default=False)] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="With --pid: keep the capture in a new folder under DIR (default: printed only).", show_default=False)] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Every rank's stack, every thread, after the groups.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="A job's shared run directory: seconds to wait for every node's capture.")] = 15.0,
) -> None:
    """Take every rank's Python stack now and say which rank holds the others.

    Kept under RUN/stacks/ (a job's shared run directory: every node's supervisor captures its own
    ranks into RUN/nodes/<node>/stacks/). Examples:

    \b
        mt stacks runs/tiny-cpu-20260101-120000 --all
        mt stacks --pid 4242 --out stacks/
    """
    from tui.read.rundir import NotARunError
    from tui.stacks.capture import NoRanksError
    from tui.stacks.text import print_pid_stacks, print_stacks

    if (run_dir is None) == (pid is None):
        fail("mt stacks: give a run directory or --pid PID (one of them)")
    if pid is not None and pid <= 0:   # psutil takes -1 for no process at all, and 0 is the kernel's
        fail(f"mt stacks: --pid: expected a process id (a whole number > 0), got {pid}")
    if out_dir is not None and pid is None:
        fail("mt stacks: --out goes with --pid (a run keeps its captures under RUN/stacks/)")
    try:
        if pid is not None:
            print_pid_stacks(pid, out_dir, show_all, sys.stdout)
        else:
            print_stacks(run_dir, show_all, sys.stdout, timeout)
    except (NotARunError, NoRanksError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.filename or out_dir}: cannot keep the capture there ({e.strerror or e})")
