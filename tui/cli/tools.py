"""`mt prepare` and `mt doctor`: tokenizing text for a run, and checking this machine."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tui.cli.common import RUN_FAILED, app, fail


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
    from tui.run.prepare import PrepareError, prepare_command

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
    from tui.run.doctor import run_doctor

    checks = run_doctor()
    for c in checks:
        typer.echo(c.line())
    if not all(c.ok for c in checks):
        raise typer.Exit(RUN_FAILED)
