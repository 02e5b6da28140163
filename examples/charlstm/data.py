"""Sums written out as text ("12+7=19;"): a dataset a small LSTM can learn, made on the fly.

`[data] factory = "examples.charlstm.data:build"` calls `build(split, **[data.args])`.
"""
from __future__ import annotations

import random

import torch
from torch.utils.data import Dataset

ALPHABET = "0123456789+=; "   # 14 symbols; the model's vocab must be at least this


class Sums(Dataset):
    """Item i is a fixed window of sum-text drawn from seed + i: the same on every rank and attempt."""

    def __init__(self, n: int, seq_len: int, seed: int) -> None:
        self.n, self.seq_len, self.seed = n, seq_len, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = random.Random(self.seed * 1_000_003 + i)
        text = ""
        while len(text) < self.seq_len + 1:
            a, b = rng.randrange(100), rng.randrange(100)
            text += f"{a}+{b}={a + b};"
        ids = torch.tensor([ALPHABET.index(c) for c in text[: self.seq_len + 1]])
        return ids[:-1], ids[1:]


def build(split: str, n: int = 20000, seq_len: int = 64, val_n: int = 512) -> Sums | None:
    """The train split, or a disjoint val split (val_n = 0: none)."""
    if split == "val":
        return Sums(val_n, seq_len, seed=2) if val_n else None
    return Sums(n, seq_len, seed=1)
