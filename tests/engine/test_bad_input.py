"""Bad configs and data fail before training with one clear line naming the file and the problem."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from .runner import REPO, SMALL, events, make_run, merge, run_engine


def run_raw(run) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", "--run-dir", str(run)], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("section,key,value,message", [
    ("train", "lr", "fast", "train.lr: expected a number > 0, got \"fast\""),
    ("train", "lr", 0, "train.lr: expected a number > 0, got 0"),
    ("model", "n_head", 3, "model.n_head: must divide model.d_model (32), got 3"),
    ("train", "micro_batch_size", 0, "train.micro_batch_size: expected an integer >= 1, got 0"),
    ("train", "precision", "fp8", "train.precision: expected one of fp32, bf16, fp16, got \"fp8\""),
    ("train", "speed", 1, "train.speed: unknown key"),
])
def test_invalid_config_json_is_one_line_exit_2(tmp_path, section, key, value, message):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(merge(SMALL, {section: {key: value}})))
    out = run_raw(run)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mt engine: {run}/config.json: {message}")
    assert not (run / "events.jsonl").exists() and not (run / "logs").exists()


def test_missing_config_json(tmp_path):
    out = run_raw(tmp_path)
    assert out.returncode == 2 and "config.json: no such file" in out.stderr


def data_failure(run) -> str:
    assert run_engine(run) == 2
    end = events(run, "run_end")[-1]
    assert end["status"] == "failed" and not events(run, "run_start")
    return end["reason"]


def test_missing_data_file(tmp_path):
    run = make_run(tmp_path, data={"source": "tokens", "path": str(tmp_path / "nope.bin")})
    assert "nope.bin: data file does not exist" in data_failure(run)


def test_token_id_beyond_vocab(tmp_path):
    path = tmp_path / "tok.bin"
    np.array([1, 2, 3, 64, 5] * 100, dtype=np.uint16).tofile(path)
    run = make_run(tmp_path, data={"source": "tokens", "path": str(path)})
    assert f"{path}: token id 64 is >= model.vocab_size (64)" in data_failure(run)


def test_odd_sized_token_file(tmp_path):
    path = tmp_path / "tok.bin"
    path.write_bytes(b"\x01\x00\x02")
    run = make_run(tmp_path, data={"source": "tokens", "path": str(path)})
    assert "is not a multiple of 2 bytes" in data_failure(run)


def test_sequence_longer_than_the_data(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("hello")
    run = make_run(tmp_path, model={"vocab_size": 256}, data={"source": "text", "path": str(path)})
    assert "shorter than model.seq_len + 1 (33)" in data_failure(run)


def test_text_and_token_files_train(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    run = make_run(tmp_path, "text", model={"vocab_size": 256}, data={"source": "text", "path": str(text), "val_fraction": 0.1}, train={"max_steps": 6, "eval_every": 3})
    assert run_engine(run) == 0
    assert len(events(run, "eval")) == 2
    tokens = tmp_path / "tok.bin"
    np.random.default_rng(0).integers(0, 64, 20000).astype(np.uint32).tofile(tokens)
    run = make_run(tmp_path, "tokens", data={"source": "tokens", "path": str(tokens), "token_dtype": "uint32"}, train={"max_steps": 4})
    assert run_engine(run) == 0
    assert events(run, "run_end")[-1]["status"] == "completed"
