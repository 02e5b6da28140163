"""A factory dataset and model for rollback runs (bench/rollback_poisoned.py, tests/engine/test_rollback.py):
a regression whose few poisoned samples make the loss non-finite (`kind = "nan"`: an inf input)
or spike it (`kind = "spike"`: a target 1e3 off). `[data] factory = "poisoned:build"`,
`[model] kind = "python"`, `factory = "poisoned:model"`, `[run] workdir` = this folder."""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class Points(Dataset):
    """Item i: x from seed i, y a fixed linear function of x plus noise; the same for every rank and attempt."""

    def __init__(self, n: int, seed: int, poison: list[int], kind: str) -> None:
        self.n, self.seed, self.poison, self.kind = n, seed, set(poison), kind
        self.w = torch.randn(16, generator=torch.Generator().manual_seed(12345))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(16, generator=g)
        y = x @ self.w + 0.1 * torch.randn((), generator=g)
        if i in self.poison:
            if self.kind == "nan":
                x = x.clone()
                x[0] = float("inf")   # a corrupt record: the forward's output is not finite
            else:
                y = y + 1e3           # a mislabelled record: the loss jumps
        return x, y


def build(split: str, n: int = 8192, poison: list[int] | None = None, kind: str = "nan", val_n: int = 1024) -> Points | None:
    if split == "val":
        return Points(val_n, 2, [], kind) if val_n else None
    return Points(n, 1, poison or [], kind)


class Regressor(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.mse_loss(self.net(x).squeeze(-1), y)}


def model(hidden: int = 64) -> Regressor:
    return Regressor(hidden)


def order(n: int, seed: int, positions: list[int]) -> list[int]:
    """The dataset indices at these positions of the global order (engine/data.py GlobalOrderSampler,
    first epoch): where to plant poison so it is met at known steps."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return [int(perm[p]) for p in positions]
