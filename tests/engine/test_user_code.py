"""A user's own model and dataset in the engine: init_from, what the model returns, what is counted."""
from __future__ import annotations

import pytest
import torch

from .runner import events, logs, make_run, run_engine
from .usercode import user_base

SHORT = {"train": {"max_steps": 12, "grad_accum_steps": 1}, "checkpoint": {"every_steps": 0}}


def test_user_model_reports_tokens_samples_and_active_params(tmp_path):
    base = user_base(tmp_path)
    run = make_run(tmp_path, "moe", base, model={**base["model"], "factory": "my_models:experts", "args": {}}, **SHORT)
    assert run_engine(run) == 0, logs(run)
    start = events(run, "run_start")[0]
    assert start["params_active"] == 1234 and start["params_total"] > 1234
    assert start["model"] == "my_models:experts(...)" and start["flops_per_token"] == 6.0 * start["params_total"]
    assert start["tokens_per_step"] == 4 * 16 and start["seq_len"] == 16      # micro 4 x input_ids of 16
    step = events(run, "step")[-1]
    assert step["samples_per_s"] > 0 and step["tokens_per_s"] == step["samples_per_s"] * 16
    assert step["tokens_seen"] == step["samples_seen"] * 16


def test_samples_without_tokens_are_counted_as_samples(tmp_path):
    from tui.read.follower import load_run_state
    from tui.widgets.header import render_header

    base = user_base(tmp_path)
    run = make_run(tmp_path, "points", base, **SHORT, model={**base["model"], "factory": "my_models:regressor", "args": {}},
                   data={**base["data"], "factory": "my_data:points", "args": {}})
    assert run_engine(run) == 0, logs(run)
    assert events(run, "run_start")[0]["tokens_per_step"] is None
    step = events(run, "step")[-1]
    assert step["tokens_per_s"] is None and step["samples_per_s"] > 0 and "mfu" not in step
    header = render_header(load_run_state(run), step["t"], 200, 0.0, False).plain
    assert "samples/s " in header and "tok/s" not in header and "params 161" in header
    log = (run / "logs" / "rank0.log").read_text()
    assert "global batch 4 samples, from step 0" in log and "? tokens" not in log, log


def test_init_from_continues_at_the_earlier_runs_loss_and_refuses_weights_that_do_not_fit(tmp_path):
    from engine.weights import InitFromError, load_into, read_state
    from tests.engine.usercode import work_folder

    base = user_base(tmp_path)
    first = make_run(tmp_path, "first", base, checkpoint={"every_steps": 0},
                     train={"max_steps": 40, "grad_accum_steps": 1, "lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 0})
    assert run_engine(first) == 0, logs(first)
    losses = [s["loss"] for s in events(first, "step")]
    run = make_run(tmp_path, "again", base, **SHORT, model={**base["model"], "init_from": str(first)})
    assert run_engine(run) == 0, logs(run)
    start = events(run, "run_start")[0]
    assert start["start_step"] == 0 and start["resumed_from"] is None
    again = events(run, "step")[0]["loss"]
    # fresh optimizer, same weights: the first loss is where the earlier run ended, not where it began
    assert abs(again - losses[-1]) < 0.25 * (losses[0] - losses[-1]), (again, losses[0], losses[-1])

    # the same weights as a checkpoint folder, a .pt state dict and a {"model": ...} training-script file
    final = [c for c in events(first, "checkpoint") if c["reason"] == "final"][-1]["path"]
    state = torch.load(f"{final}/model.pt", weights_only=True)
    torch.save(state, tmp_path / "weights.pt")
    torch.save({"model": state, "step": 40}, tmp_path / "script.pt")
    for source in (first, final, tmp_path / "weights.pt", tmp_path / "script.pt"):
        got, _ = read_state(source)
        assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state), source

    import sys
    sys.path.insert(0, str(work_folder(tmp_path)))
    try:
        import my_models
    finally:
        sys.path.pop(0)
    torch.save({"tok_emb.weight": torch.zeros(3, 3)}, tmp_path / "other.pt")
    for model, source, words in (
        (my_models.build(hidden=48), first, ["shape mismatch for 'embed.weight'", "[32, 32] in the file, [32, 48] in the model"]),
        (my_models.build(), tmp_path / "other.pt", ["missing key 'embed.weight' (and 4 more)", "unexpected key 'tok_emb.weight'"]),
    ):
        with pytest.raises(InitFromError) as e:
            load_into(model, *read_state(source))
        assert str(e.value).startswith("model.init_from: ") and all(w in str(e.value) for w in words), str(e.value)

    # in a real run: exit 2 before the first step, the reason in run_end
    wider = make_run(tmp_path, "wider", base, **SHORT, model={**base["model"], "args": {**base["model"]["args"], "hidden": 48},
                                                             "init_from": str(first)})
    assert run_engine(wider) == 2, logs(wider)
    reason = events(wider, "run_end")[-1]["reason"]
    assert reason.startswith("model.init_from: ") and "shape mismatch for 'embed.weight'" in reason and not events(wider, "step")


def test_a_model_that_returns_no_loss_fails_at_the_first_step_saying_what_came_back(tmp_path):
    base = user_base(tmp_path)
    run = make_run(tmp_path, "logits", base, **SHORT, model={**base["model"], "factory": "my_models:logits_only", "args": {}})
    assert run_engine(run, nproc=2) == 1, logs(run)
    end = events(run, "run_end")[-1]
    assert end["status"] == "failed" and end["step"] == 0
    assert "my_models:logits_only(...) returned a Tensor of shape [4, 16, 32]" in end["reason"], end["reason"]
    assert "scalar loss" in end["reason"]
    assert all("returned a Tensor" in (run / "logs" / f"rank{r}.log").read_text() for r in (0, 1))


@pytest.mark.slow
def test_a_batch_the_models_forward_cannot_take_names_the_batch_and_the_signature(tmp_path):
    base = user_base(tmp_path)  # mt's token windows come as (x, y); this forward takes keywords only
    run = make_run(tmp_path, "kwonly", base, **SHORT, model={**base["model"], "factory": "my_models:keywords_only", "args": {}},
                   data={"source": "synthetic", "synthetic_samples": 256, "factory": "", "args": {}})
    assert run_engine(run) == 2, logs(run)
    end = events(run, "run_end")[-1]
    assert end["status"] == "failed" and not events(run, "step")
    assert end["reason"].startswith("model.factory: each batch is a list of 2, passed by position"), end["reason"]
    assert "KeywordsOnly.forward(*, input_ids, labels) does not take it" in end["reason"], end["reason"]
    assert "TypeError" in (run / "logs" / "rank0.log").read_text()  # the call that failed, for the user


@pytest.mark.slow
def test_a_run_converging_to_1e_4_raises_no_loss_spike_or_grad_explosion(tmp_path):
    # the tagger learns its mapping exactly: losses ~1e-4 with dropout noise, grad norms ~1e-4 that jump 20x
    base = user_base(tmp_path)
    run = make_run(tmp_path, "converge", base, checkpoint={"every_steps": 0}, data={**base["data"], "args": {"n": 512, "seq_len": 16}},
                   train={"max_steps": 300, "grad_accum_steps": 1, "micro_batch_size": 8, "lr": 3e-2, "min_lr": 3e-2,
                          "warmup_steps": 0, "weight_decay": 0.0})
    assert run_engine(run) == 0, logs(run)
    losses = [s["loss"] for s in events(run, "step")]
    assert len(losses) == 300 and max(losses[-100:]) < 2e-3 and min(losses[-100:]) < 1e-4, losses[-100:]
    assert [(i["step"], i["code"]) for i in events(run, "incident")] == []
