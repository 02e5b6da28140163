"""Text with a tokenizer: `mt prepare`, the launch-time token cache and its reuse, resume
re-making a deleted cache, and bad input (one line, exit 2). Real files, real processes."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.cli.conftest import mt, run_dir_from, write_preset
from tests.corpus import write_corpus
from tui.supervise.launch import Overrides, create_run
from tui.tools import prepare

pytest.importorskip("tokenizers")

VOCAB = 320
# a small model on tokenized text: 1 process, a handful of steps
TEXT_MODEL = {"vocab_size": VOCAB, "n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 32}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 200 KB generated text and a byte-level BPE trained on it by `mt prepare --train-tokenizer`."""
    d = tmp_path_factory.mktemp("corpus")
    text = write_corpus(d / "corpus.txt", 200_000)
    tok = d / "tok.json"
    r = mt("prepare", text, "--train-tokenizer", tok, "--vocab", VOCAB)
    assert r.returncode == 0, r.stderr
    assert f"vocab {VOCAB}" in r.stdout and tok.is_file()
    return text, tok


def _encoding(text: Path, tok: Path) -> list[int]:
    return prepare.load_tokenizer(tok).encode(text.read_text(encoding="utf-8"), add_special_tokens=False).ids


def _text_preset(tmp_path: Path, runs: Path, text: Path, tok: Path, data: dict | None = None, model: dict | None = None,
                 **sections: dict) -> Path:
    """SMALL on TEXT with the tokenizer TOK (and overrides)."""
    data = {"source": "text", "path": str(text), "tokenizer": str(tok), "val_fraction": 0.0, **(data or {})}
    model = dict(model or {})
    if "hf" in model:  # a Hugging Face model: its own table, none of the GPT's keys
        sections["model.hf"] = model.pop("hf")
        model.update({k: None for k in TEXT_MODEL if k != "seq_len"})
    return write_preset(tmp_path / "p.toml", runs, model={**TEXT_MODEL, **model}, data=data, **sections)


def test_prepare_writes_the_tokenizers_encoding(tmp_path: Path, corpus: tuple[Path, Path]) -> None:
    text, tok = corpus
    out = tmp_path / "corpus.bin"
    r = mt("prepare", text, "--tokenizer", tok, "--out", out)
    assert r.returncode == 0, r.stderr
    ids = _encoding(text, tok)
    assert np.fromfile(out, dtype=np.uint16).tolist() == ids  # ~4 pieces of 64 KB, cut apart
    assert f"{len(ids):,} tokens (uint16)" in r.stdout and "MB/s" in r.stdout
    assert 'token_dtype = "uint16"' in r.stdout and f"vocab_size >= {VOCAB}" in r.stdout
    assert "tokenizing" in r.stderr


def test_small_pieces_give_the_same_tokens(tmp_path: Path, corpus: tuple[Path, Path]) -> None:
    text, tok = corpus
    made = prepare.tokenize_file(text, prepare.load_tokenizer(tok), tmp_path / "x.bin", piece_bytes=97)
    assert np.fromfile(made.path, dtype=np.uint16).tolist() == _encoding(text, tok)
    assert made.text_bytes == text.stat().st_size and made.dtype == "uint16"


def test_a_vocab_past_uint16_is_written_as_uint32(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "big": 70_000}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "t.txt").write_text("a big a zz big")
    made = prepare.tokenize_file(tmp_path / "t.txt", tok, tmp_path / "t.bin")
    assert prepare.vocab_size(tok) == 70_001 and made.dtype == "uint32"
    assert np.fromfile(made.path, dtype=np.uint32).tolist() == [1, 70_000, 1, 0, 70_000]


def test_launch_tokenizes_once_and_reuses_the_cache(tmp_path: Path, corpus: tuple[Path, Path],
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    text, tok = corpus
    runs = tmp_path / "runs"
    preset = _text_preset(tmp_path, runs, text, tok)
    first = json.loads((create_run(preset, Overrides()) / "config.json").read_text())["data"]
    assert "tokenized" in capfd.readouterr().err
    cache = Path(first["token_cache"])
    assert cache.parent == runs.resolve() / ".tokens" and first["token_dtype"] == "uint16"
    assert np.fromfile(cache, dtype=np.uint16).tolist() == _encoding(text, tok)
    before = cache.stat().st_mtime_ns
    second = json.loads((create_run(preset, Overrides(name="again")) / "config.json").read_text())["data"]
    err = capfd.readouterr().err
    assert "reusing" in err and "tokenizing" not in err
    assert second["token_cache"] == str(cache) and cache.stat().st_mtime_ns == before
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name, cache.with_suffix(".json").name]


def _fake_tokenizers(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import tokenizers` fails, as where the hf extra is not installed."""
    (tmp_path / "fake" / "tokenizers").mkdir(parents=True)
    (tmp_path / "fake" / "tokenizers" / "__init__.py").write_text("raise ImportError('No module named tokenizers')\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")])}


BAD = [  # (case, data overrides or what to do to the tokenizer, model overrides, words in the line)
    ("missing-tokenizer", {"tokenizer": "/nonexistent/tok.json"}, {}, ["data.tokenizer", "no such file", "/nonexistent/tok.json"]),
    ("tokenizer-not-json", "not-json", {}, ["data.tokenizer", "not a tokenizers JSON file"]),
    ("vocab-too-small", {}, {"vocab_size": 300}, ["model.vocab_size", str(VOCAB), "300"]),
    ("hf-vocab-too-small", {}, {"kind": "hf", "hf": {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16,
                                                      "vocab_size": 300, "n_positions": 64}},
     ["model.hf.vocab_size", "(300)", f"({VOCAB})", "tok.json"]),
    ("tokenizer-without-text", {"source": "tokens"}, {}, ["data.tokenizer", '"text"']),
    ("tokenizers-not-installed", "no-library", {}, ["data.tokenizer", 'pip install -e ".[hf]"']),
]


@pytest.mark.parametrize("case, data, model, words", BAD, ids=[c[0] for c in BAD])
def test_bad_tokenizer_input_is_one_line_exit_2(tmp_path: Path, corpus: tuple[Path, Path], case: str,
                                                data: object, model: dict, words: list[str]) -> None:
    text, tok = corpus
    env = _fake_tokenizers(tmp_path) if data == "no-library" else None
    if data == "not-json":
        tok = tmp_path / "tok.json"
        tok.write_text("this is not JSON\n")
    runs = tmp_path / "runs"
    preset = _text_preset(tmp_path, runs, text, tok, data=data if isinstance(data, dict) else None, model=model)
    r = mt("launch", preset, "--detach", env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"mt: {preset}: "), err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"
    assert not runs.exists() or [p.name for p in runs.iterdir() if not p.name.startswith(".")] == []


@pytest.mark.parametrize("case", ["tokenizer-not-json", "text-missing", "vocab-below-bytes", "no-library"])
def test_prepare_bad_input_is_one_line_exit_2(tmp_path: Path, corpus: tuple[Path, Path], case: str) -> None:
    text, tok = corpus
    args: list[object] = [text, "--tokenizer", tok, "--out", tmp_path / "x.bin"]
    env = _fake_tokenizers(tmp_path) if case == "no-library" else None
    if case == "tokenizer-not-json":
        (tmp_path / "bad.json").write_text("{")
        args[2] = tmp_path / "bad.json"
    elif case == "text-missing":
        args[0] = tmp_path / "nope.txt"
    elif case == "vocab-below-bytes":
        args = [text, "--train-tokenizer", tmp_path / "t.json", "--vocab", "100"]
    r = mt("prepare", *args, env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("mt: "), r.stderr
    assert not (tmp_path / "x.bin").exists() and not (tmp_path / "t.json").exists()
    if env:
        assert 'pip install -e ".[hf]"' in r.stderr


@pytest.mark.slow
def test_launch_trains_on_tokens_and_resume_remakes_a_deleted_cache(tmp_path: Path, corpus: tuple[Path, Path]) -> None:
    src, tok = corpus
    text = tmp_path / "corpus.txt"
    shutil.copyfile(src, text)
    runs = tmp_path / "runs"
    preset = _text_preset(tmp_path, runs, text, tok, launch={"nproc_per_node": 1, "device": "cpu"},
                          train={"max_steps": 6, "warmup_steps": 0}, checkpoint={"every_steps": 2},
                          faults={"crash_at_step": 4})
    r = mt("launch", preset, "--headless")
    assert r.returncode == 1 and "injected crash" in r.stdout, (r.stdout, r.stderr)  # after the step-2 checkpoint
    run = run_dir_from(r.stdout)
    assert "step 3/6" in r.stdout
    cache = Path(json.loads((run / "config.json").read_text())["data"]["token_cache"])
    tokens = cache.read_bytes()
    shutil.rmtree(cache.parent)

    text.write_text(text.read_text() + "changed\n")  # the cache cannot be made again from other text
    r = mt("resume", run, "--detach")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "token cache" in r.stderr and "changed since launch" in r.stderr and not cache.exists()

    shutil.copyfile(src, text)
    r = mt("resume", run, "--headless")
    assert r.returncode == 0 and "completed" in r.stdout, (r.stdout, r.stderr)
    assert "tokenized" in r.stderr and cache.read_bytes() == tokens
