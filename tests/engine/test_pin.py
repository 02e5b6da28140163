"""The loader pins batches only when a CUDA run's samples are CPU tensors (issue 31 item 4): a dataset
that returns tensors already on the device cannot be pinned, and DataLoader's pin thread fails on them."""
from __future__ import annotations

import torch

from engine.user import pin_batches

CUDA = torch.device("cuda", 0)


def test_only_cpu_samples_of_a_cuda_run_are_pinned():
    on_host = {"input_ids": torch.zeros(8, dtype=torch.long), "labels": [torch.zeros(8)]}
    assert pin_batches(on_host, CUDA)
    assert not pin_batches(on_host, torch.device("cpu"))  # nothing to copy to
    # "meta" stands in for a device this machine may not have: any tensor off the host is not pinned
    on_device = {"input_ids": torch.zeros(8, dtype=torch.long, device="meta"), "labels": torch.zeros(8)}
    assert not pin_batches(on_device, CUDA)
    assert not pin_batches({"text": "no tensors"}, CUDA)
