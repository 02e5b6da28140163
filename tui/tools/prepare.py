"""Tokenize a text file into a flat token file with a `tokenizers` JSON tokenizer; train a small BPE.

One implementation for `mt prepare` and for `mt launch` of `[data] source = "text"` with a
`tokenizer`, whose tokens are cached in `<runs_dir>/.tokens/<key>.bin` (keyed by content hashes).
"""
from __future__ import annotations

import array
import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator, TextIO

from mt.contract import door
from mt.contract.events import JSON_ERRORS
from mt.contract.jsonl import write_json_atomic
from tui.format.fmt import fmt_mb, fmt_mb_rate
from tui.read.procs import usable_cores

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PIECE_BYTES = 64 * 1024
"""Pieces encoded on their own: small enough that a batch of them keeps every thread busy."""
CACHE_FORMAT = 1
"""Part of the cache key: bump it when the way pieces are cut or tokens are written changes."""
INSTALL = 'needs the tokenizers library: pip install -e ".[hf]"'

# Pieces are cut just before a space between two printable ASCII characters ("x| y"): GPT-2's
# byte-level split (and Llama 3's, whitespace and metaspace splits) always starts a pre-token
# there, so encoding the pieces apart gives the tokens of the whole text.
_SAFE_CUT = re.compile(rb"(?<=[\x21-\x7e])(?= [\x21-\x7e])")


class PrepareError(ValueError):
    """A tokenizer, text or output that cannot be used; `what` is "tokenizer", "text", "out" or
    "args" (`mt prepare` options that do not go together)."""

    def __init__(self, what: str, message: str) -> None:
        self.what, self.message = what, message
        super().__init__(message)


@dataclass
class Tokens:
    """A token file: where, its element type, how many tokens, made from how many text bytes."""

    path: Path
    dtype: str
    tokens: int
    text_bytes: int
    seconds: float = 0.0


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A `tokenizers` Tokenizer from its JSON file (a Hugging Face tokenizer.json)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise PrepareError("tokenizer", INSTALL) from None
    p = Path(path)
    try:
        with open(p, "rb"):
            pass
    except FileNotFoundError:
        raise PrepareError("tokenizer", f"no such file: {p}") from None
    except OSError as e:
        raise PrepareError("tokenizer", f"{p}: cannot read: {e.strerror or e}") from None
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exception for any bad file
        raise PrepareError("tokenizer", f"{p}: not a tokenizers JSON file ({_first_line(e)})") from None


def vocab_size(tok: Tokenizer) -> int:
    """One more than the largest token id (added tokens included): the model's vocab must reach it."""
    ids = tok.get_vocab(with_added_tokens=True).values()
    return max(tok.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)


def dtype_for(vocab: int) -> str:
    """uint16 when every id fits, else uint32."""
    return "uint16" if vocab <= 1 << 16 else "uint32"


def threads() -> int:
    """Threads the tokenizers library encodes with (RAYON_RS_NUM_THREADS, else the usable cores)."""
    env = os.environ.get("RAYON_RS_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else usable_cores()


def pieces(f: BinaryIO, size: int = PIECE_BYTES) -> Iterator[bytes]:
    """The file in pieces of about `size` bytes, each cut at a safe space (_SAFE_CUT).

    Text with no such space for 16 pieces is cut at a character boundary instead (a token
    there may come out split).
    """
    buf = b""
    while True:
        block = f.read(size)
        if not block:
            if buf:
                yield buf
            return
        buf += block
        m = _SAFE_CUT.search(buf, size)
        if m:
            cut = m.start()
        elif len(buf) >= 16 * size:
            cut = len(buf) - 1
            while cut > 0 and 0x80 <= buf[cut] < 0xC0:  # not inside a UTF-8 character
                cut -= 1
            cut = cut or len(buf)
        else:
            continue
        yield buf[:cut]
        buf = buf[cut:]


def _batches(it: Iterator[bytes], n: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


class ProgressLine:
    """A progress line on stderr: rewritten in place on a terminal, one line every 5 s otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.stream = total, stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = self.last = time.monotonic()
        if self.tty:
            self.update(0)

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self.tty and now - self.last < 5:
            return
        self.last = now
        pct = 100 * done / self.total if self.total else 100
        line = f"tokenizing: {pct:3.0f}% ({fmt_mb(done)} of {fmt_mb(self.total)} MB, {fmt_mb_rate(done, now - self.t0)} MB/s)"
        self.stream.write(f"\r{line}" if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def tokenize_file(text: str | Path, tok: Tokenizer, out: str | Path, piece_bytes: int = PIECE_BYTES, show: bool = False) -> Tokens:
    """Encode TEXT with `tok` in parallel (no special tokens added) into the flat token file `out`.

    Written to a temporary name and renamed, so `out` is whole or absent. `show`: a start line
    and a progress line on stderr.
    """
    text, out = Path(text), Path(out)
    progress = None
    if show:
        total = text.stat().st_size if text.is_file() else 0
        print(f"tokenizing {text} ({fmt_mb(total)} MB) on {threads()} threads into {out}", file=sys.stderr, flush=True)
        progress = ProgressLine(total)
    dtype = dtype_for(vocab_size(tok))
    code = "H" if dtype == "uint16" else "I"
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: about twice as fast
    per_call = max(64, 8 * threads())  # pieces per encode call: enough to balance the threads
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    t0, done, count = time.monotonic(), 0, 0
    try:
        src = open(text, "rb")
    except OSError as e:
        raise PrepareError("text", f"{text}: cannot read: {e.strerror or e}") from None
    try:
        with src, open(tmp, "wb") as dst:
            for batch in _batches(pieces(src, piece_bytes), per_call):
                strings = []
                for b in batch:
                    strings.append(_decode(text, done, b))
                    done += len(b)
                for enc in encode(strings, add_special_tokens=False):  # the library's threads
                    ids = array.array(code, enc.ids)
                    ids.tofile(dst)
                    count += len(ids)
                if progress:
                    progress.update(done)
        os.replace(tmp, out)
    except OSError as e:
        raise PrepareError("out", f"{out}: cannot write: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
        if progress:
            progress.close()
    return Tokens(out, dtype, count, done, time.monotonic() - t0)


def _decode(path: Path, offset: int, piece: bytes) -> str:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PrepareError("text", f"{path}: not UTF-8 text (byte {offset + e.start})") from None


def cache_key(text: str | Path, tokenizer: str | Path) -> str:
    """The token cache's name: a hash of the text's and the tokenizer's contents (and CACHE_FORMAT)."""
    h = hashlib.sha256(f"mt-tokens-{CACHE_FORMAT}\n".encode())
    for what, p in (("text", text), ("tokenizer", tokenizer)):
        try:
            with open(p, "rb") as f:
                h.update(hashlib.file_digest(f, "sha256").digest())
        except OSError as e:
            raise PrepareError(what, f"{p}: cannot read: {e.strerror or e}") from None
    return h.hexdigest()[:32]


def cache_dir(runs_dir: str | Path) -> Path:
    """Where the token caches of the runs in runs_dir live (a dot folder: `mt ls` skips it)."""
    return Path(runs_dir).expanduser().resolve() / ".tokens"


def read_cache(path: str | Path) -> Tokens | None:
    """The cached token file at path, if it and its sidecar (`<key>.json`) are there and agree."""
    path = Path(path)
    try:
        meta = door.read_json(path.with_suffix(".json"))    # in runs_dir/.tokens: through the door
        size = path.stat().st_size
        dtype, n = meta["dtype"], meta["tokens"]
    except (OSError, TypeError, KeyError, *JSON_ERRORS):
        return None
    if dtype not in ("uint16", "uint32") or not isinstance(n, int) or size != n * (2 if dtype == "uint16" else 4):
        return None
    return Tokens(path, dtype, n, int(meta.get("text_bytes", 0)))


def build_cache(text: str | Path, tok: Tokenizer, tokenizer: str | Path, path: Path) -> Tokens:
    """Tokenize text into the cache file `path` and write its sidecar, with a progress line on stderr."""
    text = Path(text)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise PrepareError("out", f"{path.parent}: cannot create: {e.strerror or e}") from None
    made = tokenize_file(text, tok, path, show=True)
    try:
        write_json_atomic(path.with_suffix(".json"), {
            "format": CACHE_FORMAT, "text": str(text), "tokenizer": str(tokenizer), "dtype": made.dtype,
            "tokens": made.tokens, "text_bytes": made.text_bytes, "vocab_size": vocab_size(tok),
            "seconds": round(made.seconds, 3), "created": time.time(),
        })
    except OSError as e:
        raise PrepareError("out", f"{path.with_suffix('.json')}: cannot write: {e.strerror or e}") from None
    print(f"tokenized {text}: {summary(made)}", file=sys.stderr)
    return made


def summary(made: Tokens) -> str:
    """How many tokens of which type, from how much text, how fast."""
    return (f"{made.tokens:,} tokens ({made.dtype}) from {fmt_mb(made.text_bytes)} MB in {made.seconds:.1f} s, "
            f"{fmt_mb_rate(made.text_bytes, made.seconds)} MB/s on {threads()} threads")


def cached_tokens(text: str | Path, tok: Tokenizer, tokenizer: str | Path, folder: Path) -> Tokens:
    """The cache for this text and tokenizer in folder: reused when there, else made (once)."""
    path = folder / f"{cache_key(text, tokenizer)}.bin"
    found = read_cache(path)
    if found:
        print(f"tokens: reusing {path} ({found.tokens:,} tokens, {found.dtype})", file=sys.stderr)
        return found
    return build_cache(text, tok, tokenizer, path)


def train_bpe(text: str | Path, vocab: int, out: str | Path) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 style: every byte is a symbol, so any text encodes) and save it."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise PrepareError("tokenizer", INSTALL) from None
    if not Path(text).is_file():
        raise PrepareError("text", f"no such file: {text}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    try:
        tok.train([str(text)], trainer)
    except Exception as e:  # noqa: BLE001 - plain Exception from the Rust side (unreadable, not UTF-8)
        raise PrepareError("text", f"{text}: cannot train on it ({_first_line(e)})") from None
    try:
        tok.save(str(out))
    except Exception as e:  # noqa: BLE001 - as above
        raise PrepareError("out", f"{out}: cannot write ({_first_line(e)})") from None
    return tok



def prepare_command(text: Path, tokenizer: Path | None, out: Path | None, train_tokenizer: Path | None,
                    vocab: int, echo: Callable[[str], None]) -> None:
    """`mt prepare`: check the options, train a BPE and/or tokenize TEXT, `echo` what was made.

    PrepareError("args", ...) for options that do not go together (exit 2, like a bad file).
    """
    if tokenizer and train_tokenizer:
        raise PrepareError("args", "--tokenizer and --train-tokenizer: give one of them")
    if out is None and train_tokenizer is None:
        raise PrepareError("args", "nothing to do: give --out (with --tokenizer) or --train-tokenizer")
    if out is not None and tokenizer is None and train_tokenizer is None:
        raise PrepareError("args", "--out needs --tokenizer (or --train-tokenizer)")
    if train_tokenizer and vocab < 256:
        raise PrepareError("args", f"--vocab: expected an integer >= 256 (the 256 byte symbols), got {vocab}")
    if not text.is_file():
        raise PrepareError("text", f"{text}: no such file")
    if train_tokenizer:
        tok = train_bpe(text, vocab, train_tokenizer)
        echo(f"trained a byte-level BPE on {text}: vocab {vocab_size(tok)} -> {train_tokenizer}")
    else:
        tok = load_tokenizer(tokenizer)
    if out is not None:
        made = tokenize_file(text, tok, out, show=True)
        echo(f"{out}: {summary(made)}")
        echo(f'use it with: [data] source = "tokens", path = "{out}", token_dtype = "{made.dtype}"; '
             f"[model] vocab_size >= {vocab_size(tok)}")

def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
