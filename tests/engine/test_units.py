"""Pieces of the engine on their own: sampler order, schedule, resume planning, signals."""
from __future__ import annotations

import ast
import itertools
import signal
import time
from pathlib import Path

import pytest
from torch.utils.data import DistributedSampler

import engine
from engine.data import GlobalOrderSampler
from engine.optim import lr_at
from mt.contract.attempt import ResumeRefused, plan
from mt.contract.config import TrainConfig

from .runner import events, make_run, start, wait_for


@pytest.mark.parametrize("world", [1, 2, 4])
def test_sampler_walks_distributed_samplers_order(world):
    n, seed = 96, 5
    for epoch in (0, 1):
        for rank in range(world):
            ref = DistributedSampler(range(n), num_replicas=world, rank=rank, seed=seed, shuffle=True, drop_last=True)
            ref.set_epoch(epoch)
            ours = GlobalOrderSampler(n, seed, rank, world, start=epoch * n)
            assert list(itertools.islice(iter(ours), n // world)) == list(ref)


def test_sampler_resumes_mid_epoch_on_another_world_size():
    n, seed, pos = 64, 3, 24
    whole = list(itertools.islice(iter(GlobalOrderSampler(n, seed, 0, 1, 0)), n))
    two = [list(itertools.islice(iter(GlobalOrderSampler(n, seed, r, 2, pos)), (n - pos) // 2)) for r in (0, 1)]
    merged = [i for pair in zip(*two) for i in pair]
    assert merged == whole[pos:]


def test_a_loader_workers_batch_carries_its_indices_as_a_list_in_sampler_order():
    """Only the samples' own tensors travel through shared memory; the indices ride in the pickle."""
    import torch

    from engine.data import Indexed, Splits, build_loader
    from mt.contract.preset import config_from_dict

    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return torch.tensor([i, i * i]), torch.tensor(float(i))

    cfg = config_from_dict({"run": {"name": "u"}, "data": {"num_workers": 1}}, "test")
    sampler = GlobalOrderSampler(40, 7, 0, 1, 0)
    loader = iter(build_loader(Splits(Indexed(Squares()), None, None), sampler, 4, cfg, 0, pin=False))
    order = list(itertools.islice(iter(sampler), 8))
    for k in range(2):
        (x, y), idx = next(loader)
        assert type(idx) is list and idx == order[4 * k: 4 * k + 4]
        assert x[:, 0].tolist() == idx and y.tolist() == [float(i) for i in idx]


def test_schedule_warmup_cosine_linear_constant():
    t = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    assert lr_at(1, t) == pytest.approx(0.1) and lr_at(10, t) == pytest.approx(1.0)
    assert lr_at(60, t) == pytest.approx(0.55) and lr_at(110, t) == pytest.approx(0.1)
    t.schedule = "linear"
    assert lr_at(60, t) == pytest.approx(0.55) and lr_at(35, t) == pytest.approx(0.775)
    t.schedule = "constant"
    assert lr_at(100, t) == 1.0


def test_resume_plan_keeps_global_batch_or_refuses():
    state = {"world_size": 4, "global_batch": 64, "grad_accum_steps": 2}
    assert plan(state, 4, 8, 2, False).exact
    p = plan(state, 2, 8, 2, False)
    assert p.grad_accum_steps == 4 and not p.exact and "keeps the global batch at 64" in p.note
    with pytest.raises(ResumeRefused, match="allow_batch_change"):
        plan(state, 3, 8, 2, False)
    assert plan(state, 3, 8, 2, True).grad_accum_steps == 2


def test_second_signal_exits_at_once(tmp_path):
    run = make_run(tmp_path, train={"max_steps": 50}, faults={"step_sleep_s": 3.0})
    proc = start(run)
    wait_for(lambda: events(run, "run_start"), what="run_start")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    assert not events(run, "run_end")  # no cleanup, no final checkpoint: the user insisted


def test_attempt_config_is_derived_in_one_place():
    """A 2-rank run with faults aimed at rank 1 resumes on 1 rank; grad_accum_steps is what the engine will run."""
    from mt.contract.attempt import attempt_config
    from mt.contract.preset import config_from_dict

    raw = {"run": {"name": "t"}, "launch": {"nproc_per_node": 2, "device": "cpu"},
           "train": {"micro_batch_size": 4, "grad_accum_steps": 2, "max_steps": 40},
           "faults": {"hang_rank": 1, "hang_at_step": 30, "crash_rank": 1, "crash_at_step": 20}}
    cfg = config_from_dict(raw, "test")
    manifest = {"world_size": 2, "global_batch": 16}
    one = attempt_config(cfg, manifest, nproc=1)
    assert one.launch.nproc_per_node == 1 and one.train.grad_accum_steps == 4
    assert one.faults.hang_at_step == 0 and one.faults.crash_at_step == 0
    same = attempt_config(cfg, manifest)
    assert same == cfg  # nothing to change: config.json is not rewritten
    with pytest.raises(ResumeRefused, match="allow_batch_change"):
        attempt_config(cfg, {"world_size": 2, "global_batch": 16}, nproc=3)


def test_gpt_without_bias_has_no_bias_parameters_and_trains():
    """`[model] bias = false`: no bias in any Linear or LayerNorm; the norms keep their weights."""
    import torch

    from engine.model import GPT, count_params
    from engine.optim import build_optimizer
    from mt.contract.config import ModelConfig

    shape = dict(vocab_size=32, n_layer=2, n_head=2, d_model=16, seq_len=8)
    with_bias, without = GPT(ModelConfig(**shape)), GPT(ModelConfig(**shape, bias=False))
    assert [n for n, _ in without.named_parameters() if n.endswith(".bias")] == []
    gone = sum(p.numel() for n, p in with_bias.named_parameters() if n.endswith(".bias"))
    d, layers = 16, 2  # per block: qkv 3d, proj d, fc 4d, proj d, two norms 2d; ln_f d
    assert gone == layers * (3 * d + d + 4 * d + d + 2 * d) + d
    assert count_params(with_bias)[0] - count_params(without)[0] == gone
    assert all(m.weight is not None for m in without.modules() if isinstance(m, torch.nn.LayerNorm))
    opt = build_optimizer(without, TrainConfig(), torch.device("cpu"))
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(without.parameters()))
    idx = torch.randint(0, 32, (4, 8))
    first = without(idx, idx).item()
    for _ in range(20):
        opt.zero_grad()
        loss = without(idx, idx)
        loss.backward()
        opt.step()
    assert loss.item() < first


def test_bias_is_a_boolean_in_the_preset(tmp_path):
    from mt.contract.preset import ConfigError, load_preset

    p = tmp_path / "p.toml"
    p.write_text("[run]\nname = \"b\"\n[model]\nbias = false\n")
    assert load_preset(p).model.bias is False
    p.write_text('[run]\nname = "b"\n[model]\nbias = "no"\n')
    with pytest.raises(ConfigError, match="model.bias"):
        load_preset(p)


def test_only_engine_kinds_asks_which_model_kind_a_preset_names():
    """A new [model] kind is one file in engine/kinds/: no other engine module reads `model.kind`."""
    root = Path(engine.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "kinds":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "kind" and isinstance(node.value, ast.Attribute) and node.value.attr == "model":
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert found == []
