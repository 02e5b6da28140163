"""Token sources, the resumable global-order sampler and the DataLoader built on them.

The data position is the number of *global* samples consumed. Sample order is one fixed
permutation per epoch (the same `randperm(n, seed + epoch)` DistributedSampler draws); micro-
step k on rank r of W takes positions P + r, P + r + W, ... so any world size walks the same
global stream and a resume at position P is exact on any number of ranks.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

from engine.dist import log
from engine.factory import UserCodeError
from engine.kinds import kind_of
from mt.contract.config import Config


class DataError(ValueError):
    """Data that cannot be trained on; the message names the file and what is wrong."""


def markov_chain(vocab: int, seed: int, fanout: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random sparse Markov chain: successors (V, K) and cumulative probs (V, K)."""
    rng = np.random.default_rng(seed)
    succ = np.stack([rng.choice(vocab, size=fanout, replace=False) for _ in range(vocab)])
    probs = rng.dirichlet(np.full(fanout, 0.5), size=vocab)
    return succ, np.cumsum(probs, axis=1)


def markov_entropy(succ: np.ndarray, cum: np.ndarray, iters: int = 200) -> float:
    """Entropy rate (nats/token) of the chain: the loss floor a perfect model reaches."""
    vocab = succ.shape[0]
    probs = np.diff(np.concatenate([np.zeros((vocab, 1)), cum], axis=1), axis=1)
    pi = np.full(vocab, 1.0 / vocab)
    for _ in range(iters):  # power iteration on the sparse transition matrix
        nxt = np.zeros(vocab)
        np.add.at(nxt, succ, pi[:, None] * probs)
        pi = nxt
    h = -(probs * np.log(np.clip(probs, 1e-12, None))).sum(axis=1)
    return float((pi * h).sum())


class TokenWindows(Dataset):
    """Sample i is tokens[s : s + T + 1] with s = (first + i) * stride, as ((input, target), i).

    stride = T for a flat token stream (windows share their boundary token), T + 1 for rows
    that were cut to length T + 1. A key may carry an injected stall: (i, seconds).
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, stride: int, first: int, count: int, vocab: int, source: str) -> None:
        self.tokens, self.seq_len, self.stride, self.first, self.count = tokens, seq_len, stride, first, count
        self.vocab, self.source = vocab, source

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, key: int | tuple[int, float]) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        i = _index(key)
        start = (self.first + i) * self.stride
        chunk = torch.from_numpy(np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64))
        if int(chunk.max()) >= self.vocab:
            raise DataError(
                f"{self.source}: token id {int(chunk.max())} at sample {i} is >= the model's vocabulary ({self.vocab})"
            )
        return (chunk[:-1], chunk[1:]), i


def _index(key: int | tuple[int, float]) -> int:
    """A sampler key: an index, or (index, seconds) carrying an injected stall to sleep first."""
    if isinstance(key, tuple):
        time.sleep(key[1])  # injected dataloader stall ([faults] stall_at_step), in the worker
        return key[0]
    return key


class Indexed(Dataset):
    """A user's dataset whose items come with their index: (sample, i), as TokenWindows' do."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, key: int | tuple[int, float]) -> tuple[Any, int]:
        i = _index(key)
        return self.ds[i], i


class IndexedCollate:
    """A collate function (torch's default, or the user's) applied to the samples of (sample, i)
    items; the indices as a list. A tensor of them would cost a loader worker's batch one more
    shared-memory file descriptor to pass (about 0.4 ms a batch on a 2-core CPU), a list rides in the pickle."""

    def __init__(self, fn: Callable[[list[Any]], Any] = default_collate) -> None:
        self.fn = fn

    def __call__(self, items: list[tuple[Any, int]]) -> tuple[Any, list[int]]:
        return self.fn([s for s, _ in items]), [i for _, i in items]


@dataclass
class Splits:
    """Every item is (sample, dataset index); `collate` turns a list of items into (batch, indices)."""

    train: Dataset
    val: Dataset | None
    loss_floor: float | None
    collate: Callable[[list[Any]], Any] = dataclasses.field(default_factory=IndexedCollate)


def _windows(tokens: np.ndarray, cfg: Config, source: str, vocab: int, stride: int | None = None) -> Splits:
    T = cfg.model.seq_len
    stride = stride or T
    n = (len(tokens) - 1) // stride if stride == T else len(tokens) // stride
    if n < 1:
        raise DataError(f"{source}: {len(tokens)} tokens is shorter than model.seq_len + 1 ({T + 1})")
    n_val = int(n * cfg.data.val_fraction)
    if cfg.train.eval_every and cfg.data.val_fraction > 0 and n_val < 1:
        raise DataError(f"{source}: too little data for a validation split ({n} windows of {T + 1} tokens)")
    n_train = n - n_val
    if n_train < 1:
        raise DataError(f"{source}: no training windows left after data.val_fraction = {cfg.data.val_fraction}")
    train = TokenWindows(tokens, T, stride, 0, n_train, vocab, source)
    val = TokenWindows(tokens, T, stride, n_train, n_val, vocab, source) if n_val else None
    return Splits(train, val, None)


def _vocab(cfg: Config) -> tuple[int, str]:
    """The vocabulary the tokens must fit, and the preset key that sets it."""
    try:
        return kind_of(cfg).vocab(cfg)
    except UserCodeError as e:
        raise DataError(str(e)) from None


def build_splits(cfg: Config) -> Splits:
    """Load the configured source and split it; every problem raises DataError before training."""
    if cfg.data.source == "python" or cfg.data.collate:
        return _user_splits(cfg)
    splits = _token_splits(cfg)
    kind = kind_of(cfg)  # the windows as the model takes them
    splits.train = kind.samples(splits.train)
    splits.val = kind.samples(splits.val) if splits.val is not None else None
    return splits


def _token_splits(cfg: Config) -> Splits:
    d, m = cfg.data, cfg.model
    vocab, vocab_key = _vocab(cfg)
    if d.source == "synthetic":
        succ, cum = markov_chain(vocab, cfg.run.seed)
        rng = np.random.default_rng(cfg.run.seed + 1)
        n, T = d.synthetic_samples, m.seq_len
        seqs = np.empty((n, T + 1), dtype=np.int64)
        state = rng.integers(0, vocab, size=n)
        for t in range(T + 1):  # vectorised over samples: each column is one chain step
            seqs[:, t] = state
            k = (rng.random(n)[:, None] > cum[state]).sum(axis=1).clip(max=cum.shape[1] - 1)
            state = succ[state, k]
        # each row is its own sample: windows with stride T + 1 over the rows laid end to end
        splits = _windows(seqs.reshape(-1), cfg, "synthetic", vocab, stride=T + 1)
        splits.loss_floor = markov_entropy(succ, cum)
        return splits
    if d.source == "text" and d.tokenizer:
        # mt launch tokenized the text into this file (tui/tools/prepare.py); mt resume makes it again if it is gone
        if not d.token_cache:
            raise DataError("data.tokenizer is set but data.token_cache is not: start the run with mt launch, which tokenizes the text")
        return _token_file(Path(d.token_cache), d.token_dtype, cfg,
                           "token cache does not exist (data.token_cache); mt resume makes it again", vocab, vocab_key)
    path = Path(d.path)
    missing = "data file does not exist (data.path)"
    if not path.is_file():
        raise DataError(f"{path}: {missing}")
    if d.source == "text":
        if vocab < 256:
            raise DataError(f"{path}: text is read as bytes, so {vocab_key} must be >= 256, got {vocab}")
        try:
            tokens = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        except OSError as e:
            raise DataError(f"{path}: cannot read: {e}") from None
        return _windows(tokens, cfg, str(path), vocab)
    return _token_file(path, d.token_dtype, cfg, missing, vocab, vocab_key)


def _token_file(path: Path, dtype_name: str, cfg: Config, missing: str, vocab: int, vocab_key: str) -> Splits:
    """A flat binary token file, memory-mapped, its ids checked against the model's vocabulary."""
    if not path.is_file():
        raise DataError(f"{path}: {missing}")
    dtype = np.dtype(dtype_name)
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise DataError(f"{path}: size {size} is not a multiple of {dtype.itemsize} bytes ({dtype_name} tokens)")
    if size == 0:
        raise DataError(f"{path}: file is empty")
    try:
        tokens = np.memmap(path, dtype=dtype, mode="r")
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot map as {dtype_name}: {e}") from None
    if len(tokens) <= 256 * 1024 * 1024:  # a full scan costs well under a second per 100M tokens
        top = int(tokens.max())
        if top >= vocab:
            raise DataError(f"{path}: token id {top} is >= {vocab_key} ({vocab})")
    return _windows(tokens, cfg, str(path), vocab)


def _user_splits(cfg: Config) -> Splits:
    from engine import user
    try:
        if cfg.data.source == "python":
            train, val = user.build_dataset(cfg, "train"), user.build_dataset(cfg, "val")
            splits = Splits(Indexed(train), Indexed(val) if val is not None else None, None)
        else:
            splits = build_splits(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, collate="")))  # the tokens, collated by the user's function
        if cfg.data.collate:
            splits.collate = IndexedCollate(user.import_callable(cfg.data.collate, "data.collate"))
        return splits
    except user.UserCodeError as e:
        raise DataError(str(e)) from None


class GlobalOrderSampler(Sampler):
    """Yields this rank's dataset indices from global position `start` on, over endless epochs."""

    def __init__(self, n: int, seed: int, rank: int, world: int, start: int, stall_at: dict[int, float] | None = None) -> None:
        self.n, self.seed, self.rank, self.world, self.start = n, seed, rank, world, start
        self.stall_at = stall_at or {}
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def epoch_of(self, position: int) -> int:
        return position // self.n

    def index_at(self, position: int) -> int:
        epoch = position // self.n
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed + epoch)
            # a numpy view: indexing it per sample costs far less than indexing a tensor
            self._perm, self._perm_epoch = torch.randperm(self.n, generator=g).numpy(), epoch
        return int(self._perm[position % self.n])

    def __iter__(self) -> Iterator[int | tuple[int, float]]:
        pos = self.start + self.rank
        while True:
            idx = self.index_at(pos)
            stall = self.stall_at.get(pos)
            yield (idx, stall) if stall else idx
            pos += self.world


_SUN_PATH_MAX = 107  # bytes of an AF_UNIX socket path (Linux's sun_path, less its NUL)


def short_socket_dir() -> str | None:
    """Give multiprocessing a short temp dir when TMPDIR's is too long for a socket path.

    A DataLoader worker hands each batch over through a socket under multiprocessing's temp
    dir (pymp-*/listener-*, in TMPDIR); past 107 bytes the bind fails in the worker's feeder
    thread, the batch is lost and the loader waits forever (CPython 3.13 falls back to /tmp the
    same way). Returns the dir it chose, or None when TMPDIR's is short enough."""
    probe = os.path.join(tempfile.gettempdir(), "pymp-abcdefgh", "listener-abcdefgh")
    config = getattr(multiprocessing.current_process(), "_config", None)
    if len(os.fsencode(probe)) <= _SUN_PATH_MAX or not isinstance(config, dict) or config.get("tempdir"):
        return None
    for base in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            short = tempfile.mkdtemp(prefix="pymp-", dir=base)
            config["tempdir"] = short  # what multiprocessing.util.get_temp_dir reads; forked workers inherit it
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)
            return short
    return None


def build_loader(splits: Splits, sampler: Sampler, batch: int, cfg: Config, rank: int, pin: bool) -> DataLoader:
    """A DataLoader with its own generator, so creating its iterator never draws from the global RNG."""
    workers = cfg.data.num_workers
    if workers and (short := short_socket_dir()):
        log(f"TMPDIR {tempfile.gettempdir()} is too long for the sockets DataLoader workers hand batches "
            f"through: using {short} for them")
    return DataLoader(
        splits.train,
        batch_size=batch,
        collate_fn=splits.collate,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin,
        drop_last=False,
        generator=torch.Generator().manual_seed(cfg.run.seed * 1000 + rank),
        persistent_workers=False,
        prefetch_factor=4 if workers else None,
    )


def val_batches(splits: Splits, batch: int, n_batches: int, rank: int, world: int) -> Iterator[Any]:
    """The same fixed validation batches at every evaluation, strided across ranks."""
    val = splits.val
    assert val is not None
    for b in range(n_batches):
        idx = [(b * batch * world + rank + j * world) % len(val) for j in range(batch)]
        yield splits.collate([val[i] for i in idx])[0]
