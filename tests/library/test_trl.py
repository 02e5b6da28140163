"""TRL's SFTTrainer (examples/trl/train.py) and DPOTrainer with a peft LoRA adapter under mt, against the real
packages: a tiny GPT-2 and word tokenizer saved with save_pretrained in a tmp folder, a `datasets.Dataset.from_dict`, no hub."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mt.contract.config import HF_OFFLINE
from tests.cli.conftest import REPO, events, mt, status, wait_for
from tui.format.fmt import fmt_epoch

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parent / "scripts" / "trl_tiny.py"
EXAMPLE = REPO / "examples" / "trl" / "train.py"
STEPS = 16            # 32 texts, 4 a step: an epoch is 8 steps
# every Hugging Face download would go through this proxy, which refuses: a run that reached for the
# network would fail (mt's workers also run with HF_HUB_OFFLINE=1)
NO_NET = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}


def _losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events(run_dir, "step")}


def _trl_tokens(checkpoint: Path) -> dict[int, int]:
    """TRL's own num_tokens by step, as the Trainer's checkpoint keeps its log history."""
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {h["step"]: h["num_tokens"] for h in history if "num_tokens" in h}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and tokenizer, saved once for the module's runs (a process of its own: seconds of imports)."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    path = tmp_path_factory.mktemp("trl") / "model"
    made = subprocess.run([sys.executable, SCRIPT, "make", path], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **HF_OFFLINE, **NO_NET})
    assert made.returncode == 0, made.stderr
    return path


def test_trl_sft_with_lora_shows_its_tokens_epoch_and_trainable_share_and_resumes_exactly(tmp_path: Path, model: Path) -> None:
    runs = tmp_path / "runs"
    # the uninterrupted run and the one cut by a stop, side by side (each is one process)
    sft = ["--model", model, "--data", model / "data.jsonl", "--steps", STEPS, "--lr", "1e-2", "--lora-r", "4", "--max-length", "32"]
    ref = mt("launch", EXAMPLE, "--nproc", "1", "--runs-dir", runs / "ref", "--detach",
             "--", *sft, "--out", tmp_path / "ref-out", cwd=tmp_path, env=NO_NET)
    launch = mt("launch", EXAMPLE, "--nproc", "1", "--runs-dir", runs / "cut", "--detach",
                "--", *sft, "--out", tmp_path / "cut-out", "--sleep", "0.3", cwd=tmp_path, env=NO_NET)
    assert ref.returncode == 0 and launch.returncode == 0, ref.stderr + launch.stderr
    ref_dir, run_dir = (Path(res.stdout.strip().splitlines()[-1]) for res in (ref, launch))
    try:
        wait_for(lambda: len(events(run_dir, "step")) >= 2 or status(run_dir).get("state") == "failed", 120, "SFT steps")
        assert status(run_dir)["state"] == "running", (run_dir / "logs" / "rank0.log").read_text()[-2000:]
        ckpt = mt("ckpt", run_dir, "--timeout", "60")
        assert ckpt.returncode == 0, ckpt.stdout + ckpt.stderr
        saved = events(run_dir, "checkpoint")[-1]
        assert saved["reason"] == "request" and (Path(saved["path"]) / "adapter_model.safetensors").is_file(), saved
        wait_for(lambda: len(events(run_dir, "step")) >= 9, 120, "the second epoch")   # a mid-epoch resume
        stop = mt("stop", run_dir, "--timeout", "60")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        stopped_at = events(run_dir, "run_end")[-1]["step"]
        assert 9 <= stopped_at < STEPS and events(run_dir, "checkpoint")[-1]["reason"] == "stop"
        resumed = mt("resume", run_dir, "--headless", "--every", "0")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        wait_for(lambda: status(ref_dir).get("state") in ("completed", "failed"), 120, "the uninterrupted run to end")
    finally:
        mt("kill", run_dir)
        mt("kill", ref_dir)
    assert status(run_dir)["state"] == status(ref_dir)["state"] == "completed", (status(run_dir), status(ref_dir))
    assert [e["start_step"] for e in events(run_dir, "run_start")] == [0, stopped_at]
    assert _losses(run_dir) == _losses(ref_dir)   # every logged loss, bit for bit

    start = events(ref_dir, "run_start")[0]
    # LoRA on the one c_attn (32 -> 96) at r=4: A 4x32 + B 96x4 = 512 of the model's parameters train
    assert start["params_trainable"] == 512 < start["params_total"], start
    assert f"{start['params_total']:,} params (512 trainable), resuming from step {stopped_at}" in resumed.stdout, resumed.stdout
    steps = events(ref_dir, "step")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert [s["epoch"] for s in steps] == [s / 8 for s in range(1, STEPS + 1)], steps    # the Trainer's fractional epoch
    after = stopped_at + 1   # the resumed attempt's first step, its fractional epoch as the headless line prints it
    assert f"step {after}/16  {fmt_epoch(after / 8)}  loss" in resumed.stdout and "step 16/16  epoch 2  loss" in resumed.stdout, resumed.stdout
    assert "tok/s N/A" not in resumed.stdout.splitlines()[-3], resumed.stdout
    # TRL's num_tokens are the tokens: mt's running total is TRL's at every step (its log in the stop's
    # checkpoint), and a rate from the second on
    trl = _trl_tokens(Path(events(run_dir, "checkpoint")[-1]["path"]))
    first = events(run_dir, "step")[:stopped_at]   # the stopped attempt's
    assert [s["tokens_seen"] for s in first] == [trl[s["step"]] for s in first] and len(trl) == stopped_at, (first, trl)
    assert all(s["tokens_per_s"] > 0 for s in steps[1:])
    once = mt("watch", ref_dir, "--once").stdout
    assert "step 16/16  epoch 2  elapsed" in once and "(512 trainable)" in once and "tok/s N/A" not in once, once


def test_trl_dpo_with_lora_reports_its_loss_rewards_tokens_and_epoch(tmp_path: Path, model: Path) -> None:
    res = mt("launch", SCRIPT, "--nproc", "1", "--runs-dir", tmp_path / "runs", "--headless", "--every", "0",
             "--", "dpo", model, tmp_path / "dpo-out", 4, cwd=tmp_path, env=NO_NET)
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = Path(next(ln for ln in res.stdout.splitlines() if ln.startswith("run dir: ")).split(": ", 1)[1])
    start, steps = events(run_dir, "run_start")[0], events(run_dir, "step")
    assert start["params_trainable"] == 512 < start["params_total"], start   # the adapter trains; the base is the reference
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and [s["epoch"] for s in steps] == [0.125, 0.25, 0.375, 0.5], steps
    # DPO's loss starts at log 2 (policy = reference), its rewards are the step's extras, TRL's num_tokens its tokens
    assert abs(steps[0]["loss"] - 0.6931) < 1e-3 and all("rewards/margins" in s["extra"] for s in steps), steps
    assert all(s["tokens_per_s"] > 0 for s in steps[1:]) and steps[-1]["tokens_seen"] > steps[0]["tokens_seen"] > 0, steps
    assert "step 4/4  epoch 0.5  loss" in res.stdout, res.stdout
