"""Tokenizing generated text into the launch-time token cache (tui/tools/prepare.py), as mt launch does.

    .venv/bin/python bench/tokenize_text.py [--mb 100] [--vocab 8192] [--dir /tmp/mt-bench-tokenize]

Writes the text (tests/corpus.py) and trains a byte-level BPE on its first 4 MB once (kept in
--dir), then times a cold cache build (hash + tokenize + write) and a warm reuse.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.corpus import write_corpus
from tui.tools import prepare


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/mt-bench-tokenize"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    text, sample, tok_path = args.dir / f"corpus-{args.mb}mb.txt", args.dir / "sample.txt", args.dir / f"bpe-{args.vocab}.json"
    if not text.is_file():
        t0 = time.monotonic()
        write_corpus(text, args.mb * 1_000_000)
        print(f"wrote {text} in {time.monotonic() - t0:.1f} s")
    if not tok_path.is_file():
        with open(text, "rb") as f:
            sample.write_bytes(f.read(4_000_000))
        prepare.train_bpe(sample, args.vocab, tok_path)
    tok = prepare.load_tokenizer(tok_path)
    size = text.stat().st_size
    load = os.getloadavg()[0]
    print(f"{size / 1e6:.1f} MB of text, byte-level BPE vocab {prepare.vocab_size(tok)}, "
          f"{prepare.threads()} threads ({os.cpu_count()} cores on the machine, load {load:.2f} before)")

    cache = args.dir / "runs" / ".tokens"
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.monotonic()
    key = prepare.cache_key(text, tok_path)
    hashed = time.monotonic() - t0
    made = prepare.cached_tokens(text, tok, tok_path, cache)
    cold = time.monotonic() - t0
    t0 = time.monotonic()
    again = prepare.cached_tokens(text, tok, tok_path, cache)
    warm = time.monotonic() - t0
    assert again.path == made.path and made.path.stem == key
    print(f"cold: {cold:.1f} s = {size / 1e6 / cold:.2f} MB/s end to end (hashing {hashed:.2f} s, "
          f"tokenizing {made.seconds:.1f} s = {size / 1e6 / made.seconds:.2f} MB/s), {made.tokens:,} tokens ({made.dtype})")
    print(f"warm (reuse): {warm:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
