"""A user's own model and dataset, written into a work folder as a user would have them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .runner import SMALL, merge

MODELS = '''
import torch
import torch.nn.functional as F
from torch import nn


class Output:                       # what a Hugging Face model returns: an object with .loss
    def __init__(self, loss):
        self.loss = loss


class Tagger(nn.Module):
    def __init__(self, vocab, hidden, dropout):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.drop = nn.Dropout(dropout)
        self.mix = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids, labels):
        h = torch.tanh(self.mix(self.drop(self.embed(input_ids))))
        logits = self.head(self.drop(h))
        return Output(F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1)))


def build(vocab=32, hidden=32, dropout=0.1):
    return Tagger(vocab, hidden, dropout)


class SlowForward(Tagger):          # rank `rank`'s forward takes delay_s longer: compute-bound
    def __init__(self, vocab, hidden, rank, delay_s):
        super().__init__(vocab, hidden, 0.0)
        import os
        self.delay_s = delay_s if int(os.environ.get("RANK", 0)) == rank else 0.0

    def forward(self, input_ids, labels):
        if self.delay_s:
            import time
            time.sleep(self.delay_s)
        return super().forward(input_ids, labels)


def slow_forward(vocab=32, hidden=32, rank=1, delay_s=0.04):
    return SlowForward(vocab, hidden, rank, delay_s)


class Logits(Tagger):
    def forward(self, input_ids, labels):
        return self.head(self.embed(input_ids))


def logits_only(vocab=32, hidden=32):
    return Logits(vocab, hidden, 0.0)


class Experts(Tagger):
    def active_params(self):        # a mixture of experts counts what one token uses
        return 1234


def experts(vocab=32, hidden=32):
    return Experts(vocab, hidden, 0.0)


class Regressor(nn.Module):          # no tokens anywhere: throughput is samples/s
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 1))

    def forward(self, x, y):
        return {"loss": F.mse_loss(self.net(x).squeeze(-1), y)}


def regressor():
    return Regressor()


not_callable = 3


def raises(hidden=16):
    raise ValueError(f"hidden = {hidden} is not a multiple of 64")


class Positional(Tagger):           # a dict batch cannot reach it: its parameters are positional-only
    def forward(self, input_ids, labels, /):
        return Tagger.forward(self, input_ids, labels)


def positional(vocab=32, hidden=32):
    return Positional(vocab, hidden, 0.0)


class KeywordsOnly(Tagger):         # mt's token windows come as (x, y): they cannot reach it
    def forward(self, *, input_ids, labels):
        return Tagger.forward(self, input_ids, labels)


def keywords_only(vocab=64, hidden=32):
    return KeywordsOnly(vocab, hidden, 0.0)
'''

DATA = '''
import os
import time

import torch
from torch.utils.data import Dataset


class Pairs(Dataset):
    """Item i: random tokens and a fixed function of them, the same for every rank and attempt."""

    def __init__(self, n, seq_len, seed):
        self.n, self.seq_len, self.seed = n, seq_len, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 100003 + i)
        x = torch.randint(0, 32, (self.seq_len,), generator=g)
        return {"input_ids": x, "labels": (x * 7 + 3) % 32}


class Points(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = torch.randn(8, generator=torch.Generator().manual_seed(i))
        return x, x.sum()


def points(split):
    return Points() if split == "train" else None


def unreadable(split):
    raise ValueError("no shards under /data/shards")


class Stuck(Pairs):
    """Pairs whose rank `rank` blocks in slow_item from its `at`-th item on (a rank the others wait for)."""

    def __init__(self, n, seq_len, seed, rank, at):
        super().__init__(n, seq_len, seed)
        self.stuck, self.at, self.served = int(os.environ.get("RANK", 0)) == rank, at, 0

    def __getitem__(self, i):
        self.served += 1
        if self.stuck and self.served >= self.at:
            slow_item()
        return super().__getitem__(i)


def slow_item():
    while True:
        time.sleep(0.05)


def stuck(split, rank=2, at=20, n=512, seq_len=16):
    return Stuck(n, seq_len, 1, rank, at) if split == "train" else None


class Slow(Pairs):
    """Pairs that take `delay_s` an item on rank `rank` only (the rank the others wait for), or on "all"."""

    def __init__(self, n, seq_len, seed, rank, delay_s):
        super().__init__(n, seq_len, seed)
        self.delay_s = delay_s if rank == "all" or int(os.environ.get("RANK", 0)) == rank else 0.0

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        return super().__getitem__(i)


def slow(split, rank=1, delay_s=0.01, n=512, seq_len=16):
    return Slow(n, seq_len, 1, rank, delay_s) if split == "train" else None


def build(split, n=512, seq_len=16, val_n=0):
    if split == "val":
        return Pairs(val_n, seq_len, 2) if val_n else None
    return Pairs(n, seq_len, 1)
'''

# a user's own engine.py beside their code (torchvision's reference scripts have one): never ours
SHADOW = 'raise SystemExit("a user engine.py was imported instead of mt engine")\n'


def work_folder(root: Path) -> Path:
    """A folder holding my_models.py, my_data.py and an engine.py, as a user's project would."""
    work = root / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "my_models.py").write_text(MODELS)
    (work / "my_data.py").write_text(DATA)
    (work / "engine.py").write_text(SHADOW)
    return work


def user_base(root: Path, **model_args: Any) -> dict[str, Any]:
    """The engine tests' SMALL config with the user's model and data instead of mt's GPT."""
    return merge(SMALL, {
        "run": {"workdir": str(work_folder(root))},
        "model": {"kind": "python", "factory": "my_models:build", "args": {"vocab": 32, "hidden": 32, "dropout": 0.1, **model_args}},
        "data": {"source": "python", "factory": "my_data:build", "args": {"n": 512, "seq_len": 16}},
    })


GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 64, "n_positions": 64}
LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64, "max_position_embeddings": 64}


def hf_base(hf: dict[str, Any]) -> dict[str, Any]:
    """SMALL with a tiny Hugging Face causal LM (built from its config, offline) instead of mt's GPT."""
    return merge(SMALL, {"model": {"kind": "hf", "hf": dict(hf)}})
