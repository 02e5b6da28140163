"""A script that calls nothing from mt, whose DataLoader is far slower than its training step."""
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(1.0)  # a slow read: the worker is busy, the rank waits for it
        return torch.zeros(4)


for batch in DataLoader(Slow(), batch_size=8, num_workers=1):
    (batch * 2).sum()
