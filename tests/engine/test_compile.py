"""torch.compile (inductor on CPU), its recompile incident, and fp16 under fsdp, in real engine
processes: one rank where one proves it, a tiny GPT, few steps, one run proving several things."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

from engine.dist import DistEnv
from engine.model import GPT
from engine.parallel import wrap
from mt.contract.preset import config_from_dict
from mt.contract.toolchain import cxx_problem

from .runner import SMALL, events, logs, make_run, merge, run_engine, steps_by_attempt
from .test_parallel import Net
from .usercode import GPT2, hf_base

# A data pipeline whose third training batch in each process is 16 tokens instead of 32: the
# compiled block's guard on its input's length fails and dynamo compiles again (once: the length
# is then dynamic). Batches are collated in the training process (data.num_workers = 0); eval's
# are collated under no_grad and left whole.
RAGGED = '''
import torch
from torch.utils.data import default_collate

trained = [0]


def cut_third(samples):
    x, y = default_collate(samples)
    if not torch.is_grad_enabled():
        return x, y
    trained[0] += 1
    return (x[:, :16], y[:, :16]) if trained[0] == 3 else (x, y)
'''

COMPILED = {"train": {"compile": True, "grad_accum_steps": 1, "max_steps": 6, "strategy": "fsdp",
                      "activation_checkpointing": True, "precision": "fp16", "eval_every": 5, "eval_batches": 1},
            "data": {"collate": "ragged:cut_third", "val_fraction": 0.1}, "checkpoint": {"every_steps": 3},
            "faults": {"overflow_at_step": 2, "crash_at_step": 6}}


@pytest.mark.slow
def test_compiled_fsdp_fp16_run_recompiles_skips_an_overflow_and_resumes_exactly(tmp_path: Path) -> None:
    """Attempt 1: steps 1-5 (step 2 overflows, step 3's batch is short, checkpoint at 3, eval at 5,
    crash at 6); attempt 2 resumes at 3 and runs 4-6 (eval at 5; its third batch, step 6, is short)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "ragged.py").write_text(RAGGED)
    run = make_run(tmp_path, run={"workdir": str(work)}, **COMPILED)
    assert run_engine(run) == 1, logs(run)  # the injected crash at step 6
    assert run_engine(run, attempt=2) == 0, logs(run)

    starts = events(run, "run_start")
    assert [(s["compile"], s["strategy"], s["activation_checkpointing"]) for s in starts] == [(True, "fsdp", True)] * 2
    by = steps_by_attempt(run)
    first, second = by[1], by[2]
    assert [s["step"] for s in first] == [1, 2, 3, 4, 5] and [s["step"] for s in second] == [4, 5, 6]

    # fp16 under fsdp: the ShardedGradScaler skips the overflowing step and halves its scale
    assert [s["skipped"] for s in first] == [False, True, False, False, False]
    assert first[1]["loss_scale"] == first[0]["loss_scale"] / 2 == first[2]["loss_scale"]

    # the first compile of each process is no recompile, and eval (eager) compiles nothing; the
    # short batch is one, with torch's reason
    evals = events(run, "eval")
    assert [e["step"] for e in evals] == [5, 5, 6] and evals[0]["val_loss"] == evals[1]["val_loss"]
    assert [s["recompiles"] for s in first] == [0, 0, 1, 0, 0] and [s["recompiles"] for s in second] == [0, 0, 1]
    recompiles = [e for e in events(run, "incident") if e["code"] == "recompile"]
    assert [e["step"] for e in recompiles] == [3, 6], recompiles
    for e in recompiles:
        assert "size mismatch at index 1. expected 32, actual 16" in e["detail"], e["detail"]
        assert e["evidence"]["recompiles"] == 1 and "mark_dynamic" in e["advice"]

    # resumed steps equal the uninterrupted ones bit for bit: inductor's CPU kernels are
    # deterministic, and attempt 2's static graph gave what attempt 1's dynamic one did (torch 2.13)
    for a, b in zip(first[3:], second[:2]):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)
    assert all(torch.isfinite(torch.tensor(s["loss"])) for s in first + second)


def test_compiling_keeps_every_name_and_compiles_each_block(tmp_path: Path) -> None:
    """Module.compile() is in place: no `_orig_mod.` in parameter or state-dict names, for the GPT, a
    factory model and an HF model (nothing is traced here: compile is lazy)."""
    cfg = config_from_dict(merge(SMALL, {"train": {"compile": True}}), "test")
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    eager = GPT(cfg.model)
    names = [n for n, _ in eager.named_parameters()], list(eager.state_dict())
    model = GPT(cfg.model)
    par = wrap(model, cfg, env)
    assert par.module is model and ([n for n, _ in model.named_parameters()], list(model.state_dict())) == names
    assert all(b._compiled_call_impl is not None for b in model.blocks) and model._compiled_call_impl is None

    factory = config_from_dict(merge(SMALL, {"model": {"kind": "python", "factory": "m:build"}, "train": {"compile": True}}), "test")
    net = Net()  # a factory model that names no blocks (no train.fsdp.wrap) is compiled whole
    keys = list(net.state_dict())
    wrap(net, factory, env)
    assert net._compiled_call_impl is not None and list(net.state_dict()) == keys

    pytest.importorskip("transformers")
    from engine.kinds.hf import build_hf_model
    hf_cfg = config_from_dict(merge(hf_base(GPT2), {"train": {"compile": True}}), "test")
    hf = build_hf_model(hf_cfg)
    keys = list(hf.state_dict())
    wrap(hf, hf_cfg, env)
    compiled = [type(m).__name__ for m in hf.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    assert compiled == ["GPT2Block", "GPT2Block"] and list(hf.state_dict()) == keys


@pytest.mark.parametrize("how", ["cxx-nowhere", "cxx-not-a-compiler", "no-gxx-on-path"])
def test_a_missing_compiler_is_named(tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if how == "cxx-nowhere":
        monkeypatch.setenv("CXX", str(tmp_path / "c++"))
    elif how == "cxx-not-a-compiler":
        fake = tmp_path / "c++"
        fake.write_text("#!/bin/sh\nexit 1\n")
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("CXX", str(fake))
    else:
        monkeypatch.delenv("CXX", raising=False)
        monkeypatch.setenv("PATH", str(tmp_path))
    problem = cxx_problem()
    assert problem is not None and "C++ compiler" in problem
    assert {"cxx-nowhere": "is no executable file", "cxx-not-a-compiler": "does not run", "no-gxx-on-path": "g++ (CXX is not set)"}[how] in problem
    monkeypatch.undo()
    assert cxx_problem() is None  # this machine has one (.ci/run makes sure)


@pytest.mark.slow
def test_the_engine_refuses_compile_without_a_compiler_before_step_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run resumed where there is no compiler: exit 2 and a run_end naming train.compile, no step."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    run = make_run(tmp_path, train={"compile": True, "max_steps": 2})
    assert run_engine(run) == 2, logs(run)
    end = events(run, "run_end")[-1]
    assert end["status"] == "failed" and end["reason"].startswith("train.compile: ") and "no-such-c++" in end["reason"]
    assert events(run, "step") == []


def test_a_recompile_reaches_the_incident_file_and_the_summary_says_compile(tmp_path: Path) -> None:
    """The reader side: the step field parses (a bad one rejects the line), the engine's incident is
    copied by the supervisor's monitor and closed by steps without recompiles, `--once` shows the run's parts."""
    from mt.contract.config import MonitorConfig
    from mt.contract.records import Rejected, Step, parse_event
    from mt.rules import recompile_incident
    from tests.diagnose.fakerun import FakeRun
    from tui.read.follower import load_run_state
    from tui.report.summary import format_summary

    assert isinstance(parse_event({"kind": "step", "step": 3, "recompiles": 1}), Step)
    assert parse_event({"kind": "step", "step": 3, "recompiles": 1}).recompiles == 1
    assert isinstance(parse_event({"kind": "step", "step": 3, "recompiles": "many"}), Rejected)

    m = MonitorConfig(close_after_s=0.0)
    run = FakeRun(tmp_path / "r", monitor=m)
    run.start()  # then the extras a compiled fsdp run's run_start carries
    run.event("run_start", attempt=1, world_size=2, start_step=0, strategy="fsdp", compile=True, activation_checkpointing=True)
    run.do_step(recompiles=0)
    run.do_step(recompiles=1)
    reason = "0/0: tensor 'args[0]' size mismatch at index 1. expected 32, actual 16"
    run.event("incident", **recompile_incident(2, [("forward", reason)]).event_fields())
    for _ in range(m.close_after_steps):
        run.do_step(recompiles=0)
    opened, closed = run.opened("recompile"), run.closed("recompile")
    assert len(opened) == 1 and opened[0]["source"] == "engine" and reason in opened[0]["detail"]
    assert len(closed) == 1
    assert "fsdp + compile + act. ckpt" in format_summary(load_run_state(run.paths.root))
