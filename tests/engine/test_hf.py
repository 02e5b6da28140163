"""Hugging Face causal LMs in the engine: built from a local config or folder, offline, resumable."""
from __future__ import annotations

import json

import pytest

from .runner import events, finish, logs, make_run, run_engine, start, wait_for
from .usercode import GPT2, LLAMA, hf_base

SHORT = {"train": {"max_steps": 10, "grad_accum_steps": 1}, "checkpoint": {"every_steps": 0}}


@pytest.mark.slow
def test_a_tiny_llama_trains_stops_and_resumes_where_it_stopped(tmp_path):
    run = make_run(tmp_path, "llama", hf_base(LLAMA), train={"max_steps": 16, "grad_accum_steps": 1})
    proc = start(run)
    wait_for(lambda: any(s["step"] >= 4 for s in events(run, "step")), what="step 4")
    (run / "control").mkdir(exist_ok=True)
    (run / "control" / "stop-1.json").write_text(json.dumps({"id": "stop-1", "action": "stop", "t": 0}))
    assert finish(proc, run, 180) == 0, logs(run)
    stopped = events(run, "run_end")[-1]
    assert stopped["status"] == "stopped" and stopped["step"] < 16
    assert run_engine(run, attempt=2) == 0, logs(run)
    start2 = [e for e in events(run, "run_start") if e["attempt"] == 2][0]
    assert start2["start_step"] == stopped["step"] and start2["resumed_from"]["exact"] is True
    assert [s["step"] for s in events(run, "step")][-1] == 16
    assert start2["tokens_per_step"] == 4 * 32 and start2["params_total"] > 10_000


def test_a_local_hf_folder_is_loaded_with_its_weights(tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**GPT2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    folder = tmp_path / "tiny-gpt2"
    model.save_pretrained(folder)
    n_params = sum(p.numel() for p in model.parameters())
    run = make_run(tmp_path, "local", hf_base({"path": str(folder)}), **SHORT)
    assert run_engine(run) == 0, logs(run)
    start = events(run, "run_start")[0]
    assert start["params_total"] == n_params and start["flops_per_token"] == 6.0 * n_params  # before the count
    # torch's count at the first step, by hand: per token and layer the linears' 24 d^2 (qkv 3, out 1,
    # mlp 4 + 4), x 3 with the backward, and attention's 4 T d (QK^T and AV over T = 32 positions), x 3.5
    # (torch counts flash attention's backward as 5 matmuls: it recomputes QK^T); the head's 2 d V, x 3.
    # 6N counts the embeddings instead of attention, and the head twice over (tied to the embedding)
    d, layers, vocab, positions = GPT2["n_embd"], GPT2["n_layer"], GPT2["vocab_size"], 32
    by_hand = 3 * (layers * 24 * d * d + 2 * d * vocab) + layers * 14 * positions * d
    assert {(s["flops_per_token"], s.get("flops_estimated")) for s in events(run, "step")} == {(by_hand, None)}
    assert start["model"] == "the Hugging Face model"  # a folder names no model_type
    first_ckpt = [c for c in events(run, "checkpoint")][-1]["path"]
    trained = torch.load(f"{first_ckpt}/model.pt", weights_only=True)
    # trained from the folder's weights, not from a fresh draw: still close to them after 10 steps
    before = model.state_dict()["transformer.wte.weight"]
    assert (trained["transformer.wte.weight"] - before).abs().max() < 0.1
