"""A generated text corpus for the tokenizer tests and bench/tokenize_text.py: made-up words in lines
and paragraphs, with indentation, digits, punctuation and some non-ASCII letters."""
from __future__ import annotations

import random
from pathlib import Path

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "an", "el", "or", "ix", "qu", "zy", "é", "ø", "th"]


def write_corpus(path: Path, n_bytes: int, seed: int = 0) -> Path:
    """Write about n_bytes (at least) of UTF-8 text to path, the same for the same seed."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(3000)]
    ends = [".", ".", ",", "!", "?", ";", " —", ":"]
    block, size = [], 0
    while size < min(n_bytes, 1 << 20):
        line = " ".join(rng.choices(words, k=rng.randint(2, 14)))
        if rng.random() < 0.1:
            line += f" {rng.randint(0, 99999)}"
        line = "    " * rng.choice([0, 0, 0, 1, 2]) + line.capitalize() + rng.choice(ends)
        line += "\n\n" if rng.random() < 0.15 else "\n"
        block.append(line)
        size += len(line.encode())
    # past 1 MB: shuffled copies of the first block's lines (fast, and still not one repeated string)
    with open(path, "w", encoding="utf-8") as f:
        written = 0
        while written < n_bytes:
            text = "".join(block)
            f.write(text)
            written += len(text.encode())
            rng.shuffle(block)
    return path
