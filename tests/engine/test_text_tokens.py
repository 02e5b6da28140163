"""Text with a tokenizer on the engine side: it memory-maps the token cache mt launch made."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.data import DataError, build_splits
from mt.contract.preset import config_from_dict
from tests.corpus import write_corpus
from tui.tools import prepare

from .runner import SMALL, events, make_run, merge, run_engine

pytest.importorskip("tokenizers")


def _cache(tmp_path: Path) -> tuple[Path, Path, Path]:
    text = write_corpus(tmp_path / "c.txt", 60_000)
    tok = prepare.train_bpe(text, 300, tmp_path / "tok.json")
    made = prepare.tokenize_file(text, tok, tmp_path / "c.bin")
    return text, tmp_path / "tok.json", made.path


def test_windows_come_from_the_token_cache(tmp_path: Path) -> None:
    text, tok, cache = _cache(tmp_path)
    data = {"source": "text", "path": str(text), "tokenizer": str(tok), "token_cache": str(cache), "token_dtype": "uint16"}
    cfg = config_from_dict(merge(SMALL, {"model": {"vocab_size": 300}, "data": data}), "test")
    splits = build_splits(cfg)
    tokens = np.fromfile(cache, dtype=np.uint16)
    (x, y), i = splits.train[3]
    T = cfg.model.seq_len
    assert x.tolist() == tokens[3 * T : 4 * T].tolist() and y.tolist() == tokens[3 * T + 1 : 4 * T + 1].tolist()
    assert len(splits.train) == (len(tokens) - 1) // T  # val_fraction 0 in SMALL


def test_no_cache_recorded_is_a_data_error(tmp_path: Path) -> None:
    text, tok, _ = _cache(tmp_path)
    cfg = config_from_dict(merge(SMALL, {"model": {"vocab_size": 300},
                                         "data": {"source": "text", "path": str(text), "tokenizer": str(tok)}}), "test")
    with pytest.raises(DataError, match="data.token_cache is not: start the run with mt launch"):
        build_splits(cfg)


def test_a_deleted_cache_fails_the_attempt_naming_mt_resume(tmp_path: Path) -> None:
    text, tok, cache = _cache(tmp_path)
    run = make_run(tmp_path, model={"vocab_size": 300}, data={"source": "text", "path": str(text), "tokenizer": str(tok),
                                                              "token_cache": str(cache)})
    cache.unlink()
    assert run_engine(run) == 2
    end = events(run, "run_end")[-1]
    assert end["status"] == "failed" and "token cache does not exist" in end["reason"] and "mt resume" in end["reason"]
