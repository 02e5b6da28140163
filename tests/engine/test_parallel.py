"""engine/parallel.py in one process: which blocks are sharded, recompute in place, one checkpoint format."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.kinds import kind_of
from engine.model import GPT
from engine.optim import build_optimizer
from engine.parallel import _named, _numbered, _recompute
from engine.user import UserCodeError
from mt.contract.preset import config_from_dict

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
    assert kind_of(cfg).blocks(gpt, cfg) == list(gpt.blocks)

    pytest.importorskip("transformers")
    from engine.kinds.hf import build_hf_model
    hf_cfg = config_from_dict(hf_base(GPT2), "test")
    hf = build_hf_model(hf_cfg)
    assert [type(b).__name__ for b in kind_of(hf_cfg).blocks(hf, hf_cfg)] == ["GPT2Block", "GPT2Block"]

    factory = _cfg(model={"kind": "python", "factory": "m:build"}, train={"fsdp": {"wrap": ["Block"]}})
    assert len(kind_of(factory).blocks(Net(), factory)) == 2
    wrong = _cfg(model={"kind": "python", "factory": "m:build"}, train={"fsdp": {"wrap": ["Layer"]}})
    with pytest.raises(UserCodeError, match=r"train\.fsdp\.wrap.*no module of class Layer in Net .*Block"):
        kind_of(wrong).blocks(Net(), wrong)


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


# Two gloo ranks: rank 1 builds the model on the meta device (engine/parallel.py build) and gets its
# shards from rank 0 in wrap; the whole state, every buffer and a forward must equal a plain build's.
FROM_RANK0 = '''
import json, sys
import torch, torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from engine.dist import DistEnv
from engine.kinds import kind_of
from engine.parallel import build, wrap
from mt.contract.preset import config_from_dict

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
env = DistEnv(rank, rank, world, torch.device("cpu"), "gloo")
out = {}
for name, preset in json.loads(sys.argv[1]).items():
    cfg = config_from_dict(preset, "test")
    torch.manual_seed(5)
    model = build(lambda: kind_of(cfg).build(cfg), cfg, env)
    meta = [p.is_meta for p in model.parameters()]
    wrap(model, cfg, env)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    x = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(1))
    model.eval()  # no dropout: the RNG streams differ (a meta build draws nothing)
    with torch.no_grad():
        got = model(x, x) if cfg.model.kind == "gpt" else model(input_ids=x, labels=x).loss
    bufs = {k: v.clone() for k, v in model.named_buffers()}
    rows = [None] * world
    dist.all_gather_object(rows, (all(meta), float(got), bufs))
    if rank == 0:
        torch.manual_seed(5)
        ref = kind_of(cfg).build(cfg).eval()
        with torch.no_grad():
            want = ref(x, x) if cfg.model.kind == "gpt" else ref(input_ids=x, labels=x).loss
        sd = ref.state_dict()
        out[name] = {
            "rank1_built_on_meta": rows[1][0], "rank0_built_on_meta": rows[0][0],
            "state_equal": full.keys() == sd.keys() and all(torch.equal(full[k], sd[k]) for k in sd),
            "losses": [r[1] for r in rows], "want": float(want),
            "buffers_equal": all(r[2].keys() == dict(ref.named_buffers()).keys()
                                 and all(torch.equal(v, dict(ref.named_buffers())[k]) for k, v in r[2].items()) for r in rows),
            "buffers": len(bufs),
        }
if rank == 0:
    print("RESULT " + json.dumps(out))
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_fsdp_ranks_but_0_build_on_meta_and_get_rank_0s_values(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from .usercode import LLAMA

    script = tmp_path / "from_rank0.py"
    script.write_text(FROM_RANK0)
    fsdp = {"train": {"strategy": "fsdp"}}
    presets = {"gpt": merge(SMALL, fsdp), "gpt2": merge(hf_base(GPT2), fsdp), "llama": merge(hf_base(LLAMA), fsdp)}
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
                          json.dumps(presets)], capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(next(line for line in res.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for name, r in out.items():
        assert r["rank1_built_on_meta"] and not r["rank0_built_on_meta"], (name, r)
        assert r["state_equal"] and r["buffers_equal"], (name, r)
        assert r["losses"] == [r["want"]] * 2, (name, r)  # the same forward on both ranks, as a plain build's
    assert out["llama"]["buffers"] > 0  # its rotary inv_freq is not in the state dict: broadcast whole
