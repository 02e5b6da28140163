"""engine/parallel.py in one process: which blocks are sharded, recompute in place, one checkpoint format."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.model import GPT
from engine.optim import build_optimizer
from engine.parallel import _named, _numbered, _recompute, blocks_of
from engine.user import UserCodeError
from mt.preset import config_from_dict

from .runner import SMALL, merge
from .usercode import GPT2, hf_base


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.fc(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(Block(), Block())
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x)).pow(2).mean()


def _cfg(**over):
    return config_from_dict(merge(SMALL, over), "test")


def test_the_blocks_of_the_gpt_an_hf_model_and_a_factory_model() -> None:
    cfg = _cfg()
    gpt = GPT(cfg.model)
    assert blocks_of(gpt, cfg) == list(gpt.blocks)

    pytest.importorskip("transformers")
    from engine.hf import build_hf_model
    hf_cfg = config_from_dict(hf_base(GPT2), "test")
    hf = build_hf_model(hf_cfg)
    assert [type(b).__name__ for b in blocks_of(hf, hf_cfg)] == ["GPT2Block", "GPT2Block"]

    factory = _cfg(model={"kind": "python", "factory": "m:build"}, train={"fsdp": {"wrap": ["Block"]}})
    assert len(blocks_of(Net(), factory)) == 2
    wrong = _cfg(model={"kind": "python", "factory": "m:build"}, train={"fsdp": {"wrap": ["Layer"]}})
    with pytest.raises(UserCodeError, match=r"train\.fsdp\.wrap.*no module of class Layer in Net .*Block"):
        blocks_of(Net(), wrong)


def test_recomputing_blocks_keeps_names_losses_and_gradients_bitwise() -> None:
    def run(recompute: bool) -> tuple[list[str], torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(0)
        net = Net()
        if recompute:
            for b in net.layers:
                _recompute(b)
        torch.manual_seed(1)  # dropout: the recomputed forward must draw the same masks
        loss = net(torch.randn(4, 8))
        loss.backward()
        return [n for n, _ in net.named_parameters()], loss.detach(), [p.grad for p in net.parameters()]

    names, loss, grads = run(False)
    names_ac, loss_ac, grads_ac = run(True)
    assert names_ac == names and torch.equal(loss_ac, loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_ac))


def test_the_optimizer_state_renumbers_from_names_and_back() -> None:
    cfg = _cfg()
    torch.manual_seed(0)
    model = GPT(cfg.model)  # tied embeddings: one parameter under two names
    opt = build_optimizer(model, cfg.train, torch.device("cpu"))
    model(torch.randint(64, (2, 32)), torch.randint(64, (2, 32))).backward()
    opt.step()
    numbered = opt.state_dict()
    named = _named(numbered, model, opt)
    assert "tok_emb.weight" in named["state"] and named["param_groups"][0]["params"][0] == "tok_emb.weight"
    back = _numbered(named)
    assert back["param_groups"] == numbered["param_groups"]
    assert back["state"].keys() == numbered["state"].keys()
    assert all(torch.equal(back["state"][i]["exp_avg"], numbered["state"][i]["exp_avg"]) for i in numbered["state"])
