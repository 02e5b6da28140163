"""The `mt` command line: thin Typer wrappers over tui.run.launch, tui.run.control and tui.read.

Exit codes: 0 success, 1 the run failed, 2 bad input. Heavy modules (psutil, Textual, the
dashboard) are imported inside the commands that need them, so `mt --help` stays instant;
torch is never imported here.
"""
from __future__ import annotations

import sys
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, Optional

import typer

if TYPE_CHECKING:
    from tui.run.control import Answer

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
EveryOpt = Annotated[float, typer.Option("--every", metavar="SECONDS", help="With --headless: at most one step line per SECONDS (0: one per logged step); checkpoints, evals, incidents and attempts always get their line.")]
NprocOpt = Annotated[Optional[int], typer.Option("--nproc", help="Worker processes on this node (overrides launch.nproc_per_node).", show_default=False)]


def fail(message: str, code: int = BAD_INPUT) -> NoReturn:
    """One clear line on stderr, then exit with code (a path or reason from a run shown safely)."""
    from tui.format import safe_text

    typer.echo(f"mt: {safe_text(message, lines=True)}", err=True)
    raise typer.Exit(code)


def _no_dashboard(headless: bool, instead: str = "following the run as with --headless") -> bool:
    """True for --headless, and (said in one line) when stdin or stdout is not a terminal: the
    dashboard would draw into a pipe and spin on a closed input."""
    why = "" if headless else " and ".join(n for n, f in (("stdin", sys.stdin), ("stdout", sys.stdout))
                                           if f is None or not f.isatty())
    if why:
        typer.echo(f"mt: {why} not a terminal: no dashboard; {instead}", err=True)
    return headless or bool(why)


def _attach(run_dir: Path, detach: bool, headless: bool, every: float = 1.0,
            since: tuple[int, float] | None = None) -> None:
    """After starting a run: print it (--detach), follow it (--headless) or open the dashboard."""
    if detach:
        typer.echo(str(run_dir))
        return
    if _no_dashboard(headless):
        from tui.format import safe_text
        from tui.text.headless import follow_headless

        typer.echo(f"run dir: {safe_text(run_dir)}")
        raise typer.Exit(follow_headless(run_dir, sys.stdout, every_s=every, since=since))
    from tui.view.app import run_app

    raise typer.Exit(run_app(run_dir))


@app.command()
def launch(
    preset: Annotated[Path, typer.Argument(metavar="PRESET", help="A TOML preset (presets/tiny-cpu.toml), or a training script of your own (train.py).", show_default=False)],
    script_args: Annotated[Optional[list[str]], typer.Argument(metavar="-- ARGS", help="Arguments for a script, after --.", show_default=False)] = None,
    detach: DetachOpt = False,
    headless: HeadlessOpt = False,
    every: EveryOpt = 1.0,
    name: Annotated[Optional[str], typer.Option("--name", help="Run name (overrides run.name).", show_default=False)] = None,
    runs_dir: Annotated[Optional[Path], typer.Option("--runs-dir", help="Where run directories go (overrides run.runs_dir).", show_default=False)] = None,
    nproc: NprocOpt = None,
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
    from mt.config import ConfigError
    from tui.run.launch import LaunchError, Overrides, launch_run

    over = Overrides(name=name, runs_dir=str(runs_dir) if runs_dir else None, nproc=nproc, node_rank=node_rank,
                     script_args=script_args or None)
    try:
        run_dir = launch_run(preset, over)
    except ConfigError as e:
        fail(str(e))
    except LaunchError as e:
        fail(str(e), RUN_FAILED)
    _check_every(every)
    _attach(run_dir, detach, headless, every)


def _check_every(every: float) -> None:
    if not every >= 0:
        fail(f"--every: expected a number of seconds >= 0, got {every}")


MAX_COMPARED = 8   # runs one compare view overlays (colours that stay distinct)


@app.command()
def watch(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR...", help="A run directory, e.g. runs/tiny-cpu-20260101-120000; several (up to 8) open the compare view.", show_default=False)],
    once: Annotated[bool, typer.Option("--once", help="Print a plain-text summary and exit.")] = False,
    headless: Annotated[bool, typer.Option("--headless", help="No dashboard: print progress lines until the run ends and exit with its result (SIGTERM stops the run gracefully; Ctrl-C only detaches).")] = False,
    every: EveryOpt = 1.0,
) -> None:
    """Open the dashboard on a live or finished run (--once: print a summary and exit;
    --headless: print progress lines until it ends). Several runs: their losses overlaid.

    Example:

    \b
        mt watch runs/tiny-cpu-20260101-120000 --once
        mt watch runs/tiny-cpu-20260101-120000 runs/tiny-cpu-20260101-130000
    """
    from tui.rundir import NotARunError, require_run_dir

    if len(run_dirs) > MAX_COMPARED:
        fail(f"{len(run_dirs)} runs: the compare view overlays at most {MAX_COMPARED}")
    try:
        for run_dir in run_dirs:
            require_run_dir(run_dir)
    except NotARunError as e:
        fail(str(e))
    if len(run_dirs) > 1:
        _compare(run_dirs, once, headless)
    run_dir = run_dirs[0]
    if once:
        from tui.text.runs import run_summary

        typer.echo(run_summary(run_dir))
        return
    _check_every(every)
    if _no_dashboard(headless):
        _attach(run_dir, False, True, every)
    from tui.view.app import run_app

    raise typer.Exit(run_app(run_dir))


def _compare(run_dirs: list[Path], once: bool, headless: bool) -> NoReturn:
    """`mt watch A B ...`: the overlay of their losses, or (--once) its header as text."""
    if headless:
        fail("--headless follows one run; give one RUN_DIR")
    once = once or _no_dashboard(False, "the compare table, as with --once")
    if once:
        from tui.state.compare import compare_table

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
    every: EveryOpt = 1.0,
    from_scratch: Annotated[bool, typer.Option("--from-scratch", help="When no checkpoint is intact (or there is none), start again from step 0 instead of refusing; the damaged checkpoints are not deleted first.")] = False,
) -> None:
    """Start a new attempt of a stopped or failed run from its newest intact checkpoint.

    --nproc resumes on another number of workers (the global batch is kept). Example:

    \b
        mt resume runs/tiny-cpu-20260101-120000 --nproc 1 --headless
    """
    from tui.run.launch import ResumeError, resume_run
    from tui.rundir import NotARunError, newest_run

    if run_dir is None:
        run_dir = newest_run(Path("runs"))
        if run_dir is None:
            fail("no run under runs/ to resume; name one: mt resume RUN_DIR")
    if nproc is not None and nproc < 1:
        fail(f"--nproc: expected an integer >= 1, got {nproc}")
    _check_every(every)
    since = _events_end(run_dir)   # --headless prints only the new attempt's lines
    try:
        resume_run(run_dir, nproc, from_scratch)
    except (NotARunError, ResumeError) as e:
        fail(str(e))
    _attach(run_dir.resolve(), detach, headless, every, since)


def _events_end(run_dir: Path) -> tuple[int, float]:
    """(bytes of events.jsonl, wall time) now: where a resumed run's new lines begin."""
    try:
        size = (run_dir / "events.jsonl").stat().st_size
    except OSError:
        size = 0
    return size, time.time()


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
    from tui.text.runs import runs_table

    if not runs_dir.is_dir():
        fail(f"{runs_dir}: no such directory")
    typer.echo(runs_table(runs_dir, sort.value))


@app.command()
def diff(
    run_a: Annotated[Path, typer.Argument(metavar="RUN_A", help="A run directory.", show_default=False)],
    run_b: Annotated[Path, typer.Argument(metavar="RUN_B", help="Another run directory.", show_default=False)],
) -> None:
    """Compare two runs: the resolved config keys that differ, world size, final and best loss.

    Example:

    \b
        mt diff runs/tiny-cpu-20260101-120000 runs/tiny-cpu-20260101-130000
    """
    from tui.rundir import NotARunError, require_run_dir
    from tui.text.diff import DiffError, diff_text

    try:
        typer.echo(diff_text(require_run_dir(run_a), require_run_dir(run_b)))
    except (NotARunError, DiffError) as e:
        fail(str(e))


def _ask(run_dir: Path, action: str, timeout: float) -> tuple[str, Answer]:
    """Send a control request and wait for the engine's answer; a run that cannot take one fails."""
    from tui.run.control import ControlError, send_request, wait_answer
    from tui.rundir import NotARunError

    try:
        request_id = send_request(run_dir, action)
    except (NotARunError, ControlError) as e:
        fail(str(e))
    return request_id, wait_answer(run_dir, request_id, timeout)


def _answer_line(answer: Answer) -> str:
    ck = answer.checkpoint
    if answer.status == "done" and ck:
        return f"checkpoint saved at step {ck.step}: {ck.path}"
    detail = f": {answer.detail}" if answer.detail else ""
    return f"{answer.action or 'request'} {answer.status}{detail}"


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
    from tui.format import safe_text

    typer.echo(safe_text(_answer_line(answer)))
    if answer.status != "done":
        raise typer.Exit(RUN_FAILED)


@app.command()
def stop(
    run_dir: RunDirArg,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the run to stop.")] = 300.0,
) -> None:
    """Stop a live run gracefully: it finishes the step, writes a final checkpoint and exits.

    Resume it later with `mt resume`. Example:

    \b
        mt stop runs/tiny-cpu-20260101-120000
    """
    import time

    from tui.format import safe_text
    from tui.run.control import ControlError, request_stop, wait_answer, wait_final
    from tui.rundir import NotARunError
    from tui.text.runs import last_checkpoint_line

    t0 = time.monotonic()
    try:
        request_id = request_stop(run_dir)  # None: a script with no mt calls got SIGTERM instead
    except (NotARunError, ControlError) as e:
        fail(str(e))
    answer = wait_answer(run_dir, request_id, timeout) if request_id is not None else None
    if answer is not None and answer.status == "rejected":
        fail(f"stop rejected: {answer.detail}", RUN_FAILED)
    status = wait_final(run_dir, max(1.0, timeout - (time.monotonic() - t0)))
    state = status.get("state")
    if state in ("failed", "killed"):  # e.g. no room for the final checkpoint: say why
        fail(f"{run_dir}: the run ended {state}: {status.get('reason')}", RUN_FAILED)
    if state not in ("stopped", "completed"):
        fail(f"{run_dir}: the run did not stop within {timeout:g} s (state {state})", RUN_FAILED)
    typer.echo(safe_text(f"run {state}; {last_checkpoint_line(run_dir)}"))


@app.command()
def kill(
    run_dir: RunDirArg,
    grace: Annotated[float, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL.")] = 10.0,
) -> None:
    """Terminate every process of a run (SIGTERM, then SIGKILL after --grace seconds).

    No checkpoint is promised; use `mt stop` for a graceful end. Example:

    \b
        mt kill runs/tiny-cpu-20260101-120000 --grace 5
    """
    from tui.format import safe_text
    from tui.run.control import ControlError, kill_run
    from tui.rundir import NotARunError

    try:
        result = kill_run(run_dir, grace)
    except (NotARunError, ControlError) as e:
        fail(str(e))
    n = len(set(result.terminated) | set(result.killed))
    forced = f", {len(result.killed)} needed SIGKILL" if result.killed else ""
    if result.survivors:
        fail(f"{run_dir}: processes still alive after SIGKILL: {result.survivors}", RUN_FAILED)
    typer.echo(f"killed: {n} process(es) terminated{forced}; state {safe_text(result.state)}")


@app.command()
def stacks(
    run_dir: RunDirArg,
    show_all: Annotated[bool, typer.Option("--all", help="Every rank's stack, every thread, after the groups.")] = False,
) -> None:
    """Take every rank's Python stack on this node now and say which rank holds the others.

    Kept under RUN/stacks/. Example:

    \b
        mt stacks runs/tiny-cpu-20260101-120000 --all
    """
    from tui.run.stacks import NoRanksError
    from tui.rundir import NotARunError
    from tui.text.stacks import print_stacks

    try:
        print_stacks(run_dir, show_all, sys.stdout)
    except (NotARunError, NoRanksError) as e:
        fail(str(e))


@app.command()
def prepare(
    text: Annotated[Path, typer.Argument(help="A UTF-8 text file (the corpus).", show_default=False)],
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", help="A tokenizers JSON file (e.g. a Hugging Face tokenizer.json).", show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write TEXT's tokens here: a flat file for data.source = \"tokens\".", show_default=False)] = None,
    train_tokenizer: Annotated[Optional[Path], typer.Option("--train-tokenizer", help="Train a byte-level BPE on TEXT and save it here (--out then uses it).", show_default=False)] = None,
    vocab: Annotated[int, typer.Option("--vocab", help="Vocabulary size for --train-tokenizer (>= 256, the byte symbols).")] = 512,
) -> None:
    """Tokenize TEXT into a flat token file (--out), with --tokenizer or a BPE trained on it.

    Needs the hf extra (pip install -e ".[hf]"). Examples:

    \b
        mt prepare corpus.txt --train-tokenizer tok.json --vocab 512
        mt prepare corpus.txt --tokenizer tok.json --out corpus.bin
    """
    from tui import prepare as prep

    if tokenizer and train_tokenizer:
        fail("--tokenizer and --train-tokenizer: give one of them")
    if out is None and train_tokenizer is None:
        fail("nothing to do: give --out (with --tokenizer) or --train-tokenizer")
    if out is not None and tokenizer is None and train_tokenizer is None:
        fail("--out needs --tokenizer (or --train-tokenizer)")
    if train_tokenizer and vocab < 256:
        fail(f"--vocab: expected an integer >= 256 (the 256 byte symbols), got {vocab}")
    if not text.is_file():
        fail(f"{text}: no such file")
    try:
        if train_tokenizer:
            tok = prep.train_bpe(text, vocab, train_tokenizer)
            typer.echo(f"trained a byte-level BPE on {text}: vocab {prep.vocab_size(tok)} -> {train_tokenizer}")
        else:
            tok = prep.load_tokenizer(tokenizer)
        if out is not None:
            made = prep.tokenize_file(text, tok, out, show=True)
    except prep.PrepareError as e:
        fail(e.message)
    if out is not None:
        typer.echo(f"{out}: {prep.summary(made)}")
        typer.echo(f'use it with: [data] source = "tokens", path = "{out}", token_dtype = "{made.dtype}"; '
                   f"[model] vocab_size >= {prep.vocab_size(tok)}")


@app.command()
def doctor() -> None:
    """Check torch, CUDA/NCCL, the GPUs NVML sees and whether a 2-process gloo group starts.

    Example:

    \b
        mt doctor
    """
    from tui.run.doctor import run_doctor

    findings = run_doctor()
    for f in findings:
        typer.echo(f.line())
    if not all(f.ok for f in findings):
        raise typer.Exit(RUN_FAILED)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
