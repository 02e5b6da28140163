"""`mt prepare`, `mt doctor`, `mt export` and `mt release`: tokenizing text for a run, checking this machine, a run's history for other tools, a checkpoint for downstream use."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tui.cli.common import RUN_FAILED, RunDirArg, app, fail


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
    from tui.tools.prepare import PrepareError, prepare_command

    try:
        prepare_command(text, tokenizer, out, train_tokenizer, vocab, typer.echo)
    except PrepareError as e:
        fail(e.message)


@app.command()
def doctor() -> None:
    """Check torch, CUDA/NCCL, the GPUs NVML sees and whether a 2-process gloo group starts.

    Example:

    \b
        mt doctor
    """
    from tui.tools.doctor import run_doctor

    checks = run_doctor()
    for c in checks:
        typer.echo(c.line())
    if not all(c.ok for c in checks):
        raise typer.Exit(RUN_FAILED)


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


@app.command()
def release(
    run_dir: RunDirArg,
    step: Annotated[Optional[int], typer.Option("--step", metavar="S", help="Release checkpoint step-S (default: the best kept, else the newest intact).", show_default=False)] = None,
    to: Annotated[Optional[Path], typer.Option("--to", metavar="DIR", help="Write the release here, a new folder (default: RUN_DIR/release/step-S).", show_default=False)] = None,
    require: Annotated[Optional[list[str]], typer.Option("--require", metavar="\"NAME OP NUMBER\"", help="Refuse unless the eval at that step meets it, e.g. \"val_loss < 2.0\" (OP: < <= > >= ==); repeatable; beside [release] require.", show_default=False)] = None,
) -> None:
    """Write a checkpoint of RUN_DIR as a folder loadable without mt: safetensors weights, config, eval, samples, incidents.

    Refused (exit 2, nothing written) when a requirement is not met at that step, the checkpoint is
    not intact, or a non-finite loss or an open error incident precedes it without a rollback. Example:

    \b
        mt release runs/tiny-cpu-20260101-120000 --require "val_loss < 2.0" --to release/
    """
    from tui.report.release import ReleaseError
    from tui.report.release import release as write_release

    try:
        done = write_release(run_dir, step, to, require or [])
    except ReleaseError as e:
        fail(str(e))
    typer.echo(f"released step {done.step} ({done.chosen}) to {done.path}: {', '.join(done.files)}")
