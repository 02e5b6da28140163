"""A character-level LSTM language model: the kind of model `[model] kind = "python"` trains."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, dropout=dropout if layers > 1 else 0.0, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean next-character cross-entropy: the engine trains whatever scalar this returns."""
        h, _ = self.lstm(self.drop(self.embed(x)))
        logits = self.head(self.drop(h))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def build(vocab: int = 16, hidden: int = 128, layers: int = 2, dropout: float = 0.1) -> CharLSTM:
    """`[model] factory = "examples.charlstm.model:build"`; `[model.args]` are these arguments."""
    return CharLSTM(vocab, hidden, layers, dropout)
