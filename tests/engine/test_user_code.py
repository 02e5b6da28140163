"""A user's own model and dataset in the engine: init_from, what the model returns, what is counted."""
from __future__ import annotations

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
    assert start["tokens_per_step"] == 4 * 16 and start["seq_len"] == 16      # micro 4 x input_ids of 16
    step = events(run, "step")[-1]
    assert step["samples_per_s"] > 0 and step["tokens_per_s"] == step["samples_per_s"] * 16
    assert step["tokens_seen"] == step["samples_seen"] * 16


def test_init_from_continues_at_the_earlier_runs_loss(tmp_path):
    base = user_base(tmp_path)
    first = make_run(tmp_path, "first", base, checkpoint={"every_steps": 0},
                     train={"max_steps": 40, "grad_accum_steps": 1, "lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 0})
    assert run_engine(first) == 0, logs(first)
    losses = [s["loss"] for s in events(first, "step")]
    final = [c for c in events(first, "checkpoint") if c["reason"] == "final"][-1]["path"]
    state_file = tmp_path / "weights.pt"
    torch.save(torch.load(f"{final}/model.pt", weights_only=True), state_file)
    for name, source in (("from-run", first), ("from-folder", final), ("from-pt", state_file)):
        run = make_run(tmp_path, name, base, **SHORT, model={**base["model"], "init_from": str(source)})
        assert run_engine(run) == 0, logs(run)
        start = events(run, "run_start")[0]
        assert start["start_step"] == 0 and start["resumed_from"] is None
        again = events(run, "step")[0]["loss"]
        # fresh optimizer, same weights: the first loss is where the earlier run ended, not where it began
        assert abs(again - losses[-1]) < 0.25 * (losses[0] - losses[-1]), (name, again, losses[0], losses[-1])


def test_init_from_that_does_not_fit_names_the_key(tmp_path):
    base = user_base(tmp_path)
    first = make_run(tmp_path, "first", base, **SHORT)
    assert run_engine(first) == 0, logs(first)
    gpt = make_run(tmp_path, "gpt", **SHORT)
    assert run_engine(gpt) == 0, logs(gpt)
    for name, model_args, source, words in (
        ("wider", {"hidden": 48}, first, ["shape mismatch for 'embed.weight'", "[32, 32] in the file, [32, 48] in the model"]),
        ("other-model", {}, gpt, ["missing key 'embed.weight'", "unexpected key"]),
    ):
        run = make_run(tmp_path, name, base, **SHORT,
                       model={**base["model"], "args": {**base["model"]["args"], **model_args}, "init_from": str(source)})
        assert run_engine(run) == 2, logs(run)
        reason = events(run, "run_end")[-1]["reason"]
        assert reason.startswith("model.init_from: ") and all(w in reason for w in words), reason
        assert not events(run, "step")


def test_a_model_that_returns_no_loss_fails_at_the_first_step_saying_what_came_back(tmp_path):
    base = user_base(tmp_path)
    run = make_run(tmp_path, "logits", base, **SHORT, model={**base["model"], "factory": "my_models:logits_only", "args": {}})
    assert run_engine(run, nproc=2) == 1, logs(run)
    end = events(run, "run_end")[-1]
    assert end["status"] == "failed" and end["step"] == 0
    assert "my_models:logits_only(...) returned a Tensor of shape [4, 16, 32]" in end["reason"], end["reason"]
    assert "scalar loss" in end["reason"]
    assert all("returned a Tensor" in (run / "logs" / f"rank{r}.log").read_text() for r in (0, 1))
