"""MFU: the GPU peak table against NVIDIA's published figures, torch's FLOP counter against FLOPs
counted by hand, and a user's model counted at the first step of a real run (6N only as a labelled
fallback)."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from engine.metrics import FlopCount, peak_for
from mt.contract.records import parse_event
from tui.state.runstate import new_state, reduce_event
from tui.widgets.header import render_header

from .runner import events, logs, make_run, run_engine
from .usercode import user_base

S = 0.5  # a datasheet figure given only "with sparsity" (2:4): the dense peak is half of it

# (torch.cuda.get_device_name, math, TFLOP/s as published, x S where sparse only, the source)
DATASHEET = [
    ("NVIDIA H100 80GB HBM3", "bf16", 1979 * S, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM"),
    ("NVIDIA H100 80GB HBM3", "tf32", 989 * S, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM"),
    ("NVIDIA H100 80GB HBM3", "fp32", 67, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM"),
    ("NVIDIA H100 PCIe", "bf16", 1513 * S, "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe"),
    ("NVIDIA H100 PCIe", "tf32", 756 * S, "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe"),
    ("NVIDIA H100 PCIe", "fp32", 51, "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe"),
    ("NVIDIA H100 NVL", "bf16", 1671 * S, "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL"),
    ("NVIDIA H100 NVL", "fp16", 1671 * S, "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL"),
    ("NVIDIA H200", "bf16", 1979 * S, "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM"),
    ("NVIDIA H200 NVL", "bf16", 1671 * S, "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL"),
    ("NVIDIA H800", "bf16", 1979 * S, "NVIDIA H800 Tensor Core GPU datasheet, H800 SXM5"),
    ("NVIDIA H800 PCIe", "bf16", 1513 * S, "NVIDIA H800 Tensor Core GPU datasheet, H800 PCIe"),
    ("NVIDIA GH200 480GB", "bf16", 1979 * S, "NVIDIA GH200 Grace Hopper Superchip datasheet"),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312, "NVIDIA A100 Tensor Core GPU datasheet"),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156, "NVIDIA A100 Tensor Core GPU datasheet"),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5, "NVIDIA A100 Tensor Core GPU datasheet"),
    ("NVIDIA A100 80GB PCIe", "bf16", 312, "NVIDIA A100 Tensor Core GPU datasheet"),
    ("NVIDIA A800-SXM4-80GB", "bf16", 312, "NVIDIA A800 Tensor Core GPU datasheet"),
    ("NVIDIA L40S", "bf16", 362.05, "NVIDIA L40S datasheet"),
    ("NVIDIA L40", "bf16", 181.05, "NVIDIA L40 datasheet"),
    ("NVIDIA L4", "bf16", 242 * S, "NVIDIA L4 Tensor Core GPU datasheet"),
    ("NVIDIA L4", "tf32", 120 * S, "NVIDIA L4 Tensor Core GPU datasheet"),
    ("NVIDIA A10", "bf16", 125, "NVIDIA A10 Tensor Core GPU datasheet"),
    ("NVIDIA A30", "bf16", 165, "NVIDIA A30 Tensor Core GPU datasheet"),
    ("NVIDIA A40", "bf16", 149.7, "NVIDIA A40 datasheet"),
    ("NVIDIA GeForce RTX 4090", "bf16", 165.2, "NVIDIA Ada GPU architecture whitepaper, FP32 accumulate"),
    ("NVIDIA GeForce RTX 3090", "fp16", 71, "NVIDIA Ampere GA102 GPU architecture whitepaper, FP32 accumulate"),
    ("Tesla V100-SXM2-16GB", "fp16", 125, "NVIDIA Tesla V100 GPU datasheet, SXM2"),
    ("Tesla V100-PCIE-32GB", "fp16", 112, "NVIDIA Tesla V100 GPU datasheet, PCIe"),
    ("Tesla V100-SXM2-16GB", "fp32", 15.7, "NVIDIA Tesla V100 GPU datasheet, SXM2"),
]
# the whole GPU's SMs (NVIDIA's architecture whitepapers): a device showing all of them is not a slice
SMS = {"H100 PCIe": 114, "H800 PCIe": 114, "A100": 108, "A800": 108, "L40": 142, "L4": 58, "A10": 72, "A30": 56,
       "A40": 84, "RTX 4090": 128, "RTX 3090": 82, "V100": 80}


def _sms(name: str) -> int:
    return next((n for key, n in SMS.items() if f" {key}" in f" {name.replace('-', ' ')} "), 132)


@pytest.mark.parametrize("name,math,tflops,source", DATASHEET, ids=[f"{n}-{m}" for n, m, _, _ in DATASHEET])
def test_the_peak_is_the_datasheets_dense_figure_for_the_runs_math(name: str, math: str, tflops: float, source: str) -> None:
    assert peak_for(name, math, _sms(name)) == pytest.approx(tflops * 1e12, rel=1e-9), source


def test_names_match_word_by_word_and_what_the_table_lacks_gets_no_mfu() -> None:
    # "NVIDIA L40" once matched L4 (1.5x high), and H100 PCIe and NVL the SXM peak
    assert peak_for("NVIDIA L40", "bf16", 142) != peak_for("NVIDIA L4", "bf16", 142)
    assert peak_for("NVIDIA H100 PCIe", "bf16", 132) < peak_for("NVIDIA H100 NVL", "bf16", 132) < \
        peak_for("NVIDIA H100 80GB HBM3", "bf16", 132)
    for name in ("NVIDIA H20", "NVIDIA A10G", "NVIDIA GeForce RTX 4080", "Tesla T4", "cpu"):
        assert peak_for(name, "bf16", 80) is None, name          # not H200, A10, RTX 4090: unknown
    assert peak_for("Tesla V100-SXM2-16GB", "bf16", 80) is None  # no bf16 tensor cores: no honest peak
    assert peak_for("Tesla V100-SXM2-16GB", "tf32", 80) is None


def test_a_mig_slice_gets_its_share_of_the_sms() -> None:
    # A100 MIG 1g.10gb: 14 of 108 SMs; H100 3g.40gb: 60 of 132 (NVIDIA MIG user guide)
    assert peak_for("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "bf16", 14) == pytest.approx(312e12 * 14 / 108)
    assert peak_for("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "bf16", 60) == pytest.approx(989.5e12 * 60 / 132)


def test_the_counter_gives_a_linear_layers_flops_by_hand() -> None:
    batch, d_in, d_out = 4, 16, 8
    layer = nn.Linear(d_in, d_out)
    forward = 2 * batch * d_in * d_out
    x = torch.randn(batch, d_in, requires_grad=True)  # a layer inside a model: its input needs a gradient
    count = FlopCount(recompute=False)
    with count.forward():
        loss = layer(x).sum()
    with count.backward():
        loss.backward()
    assert (count.forward_flops, count.total()) == (forward, 3 * forward)
    count = FlopCount(recompute=False)  # the first layer: no gradient for its input, one matmul less
    for _ in range(2):                  # two micro-batches add up (each counter starts at zero)
        with count.forward():
            loss = layer(torch.randn(batch, d_in)).sum()
        with count.backward():
            loss.backward()
    assert count.total() == 2 * 2 * forward
    count = FlopCount(recompute=True)   # activation checkpointing: the backward recomputes the forward
    with count.forward():
        loss = checkpoint(layer, x, use_reentrant=False).sum()
    with count.backward():
        loss.backward()
    assert count.total() == 3 * forward


FLOPLESS = '''
import torch.nn.functional as F
from torch import nn


class Lookup(nn.Module):            # logits straight from a table: no matmul for torch's counter
    def __init__(self, vocab):
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, input_ids, labels):
        logits = self.table(input_ids)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def build(vocab=32):
    return Lookup(vocab)
'''


@pytest.mark.slow
def test_a_users_model_is_counted_at_the_first_step_and_6n_is_only_a_labelled_fallback(tmp_path):
    vocab, hidden = 32, 32
    base = user_base(tmp_path)
    run = make_run(tmp_path, "counted", base, train={"max_steps": 6, "grad_accum_steps": 2, "log_every": 1},
                   checkpoint={"every_steps": 0})
    assert run_engine(run, nproc=2) == 0, logs(run)
    start, steps = events(run, "run_start")[0], events(run, "step")
    assert start["flops_per_token"] == 6.0 * start["params_total"]   # what is known before the first step
    # my_models' Tagger: Linear(h, h) and Linear(h, vocab), each 2 x in x out a token forward, x 3 with the
    # backward (their inputs need gradients); the embedding, tanh, dropout and the loss have no matmul
    by_hand = 3 * (2 * hidden * hidden + 2 * hidden * vocab)
    assert [s["flops_per_token"] for s in steps] == [by_hand] * 6 and not any("flops_estimated" in s for s in steps)
    assert by_hand < 0.7 * start["flops_per_token"]                  # 6N counted the embedding and biases
    assert "FLOPs per token counted by torch at the first step: 1.229e+04" in logs(run)

    # compiled, its linears checkpointed: 3 x the forward's count (the backward's holds the recomputed
    # forward), and counting the first step costs no recompile at the second
    run = make_run(tmp_path, "compiled", base, checkpoint={"every_steps": 0},
                   train={"max_steps": 3, "log_every": 1, "compile": True, "activation_checkpointing": True,
                          "fsdp": {"wrap": ["Linear"]}})
    assert run_engine(run) == 0, logs(run)
    assert [(s["flops_per_token"], s["recompiles"]) for s in events(run, "step")] == [(by_hand, 0)] * 3
    assert not events(run, "incident")

    (tmp_path / "work" / "flopless.py").write_text(FLOPLESS)
    run = make_run(tmp_path, "estimated", base, model={**base["model"], "factory": "flopless:build", "args": {}},
                   train={"max_steps": 3, "log_every": 1}, checkpoint={"every_steps": 0})
    assert run_engine(run) == 0, logs(run)
    steps = events(run, "step")
    assert [(s["flops_per_token"], s["flops_estimated"]) for s in steps] == [(6.0 * vocab * vocab, True)] * 3
    assert "saw no matmul at the first step: MFU uses the 6N estimate" in logs(run)


def test_the_header_labels_an_estimated_mfu(tmp_path) -> None:
    line = {"v": 1, "t": 1.8e9, "kind": "step", "step": 3, "epoch": 0, "loss": 2.0, "lr": 1e-3, "grad_norm": 1.0,
            "clipped": False, "tokens_per_s": 1e5, "step_time_s": 0.1, "data_wait_s": 0.0, "samples_seen": 3,
            "tokens_seen": 300, "skipped": False, "mem_alloc_bytes": 1, "mem_peak_bytes": 1, "mfu": 0.4123,
            "flops_per_token": 1e9}
    shown = {}
    for estimated in (False, True):
        st = new_state(tmp_path)
        reduce_event(st, parse_event(json.dumps({**line, **({"flops_estimated": True} if estimated else {})})))
        shown[estimated] = render_header(st, 1.8e9, 200, 0.0, False).plain.splitlines()[1]
    assert "MFU 41.2%  " in shown[False] and "estimate" not in shown[False]
    assert "MFU ~41.2% (6N estimate)" in shown[True]
