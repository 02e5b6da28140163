"""[eval] that cannot be used: one line naming the preset and the key, exit 2, no run made."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.cli.test_user_code_input import preset_text
from tui.cli import app

runner = CliRunner()
GPT = "vocab_size = 256\nn_layer = 1\nn_head = 2\nd_model = 16\nseq_len = 16"

CASES = [
    ("no-module", 'factory = "nope:score"', ["eval.factory", "cannot import module 'nope'"]),
    ("no-attribute", 'factory = "my_eval:nothing"', ["eval.factory", "has no attribute 'nothing'"]),
    ("one-argument", 'factory = "my_eval:model_only"', ["eval.factory", "my_eval:model_only(model)", "does not accept (None, 0)"]),
    ("import-raises", 'factory = "broken_eval:score"', ["eval.factory", "importing 'broken_eval' failed", "ZeroDivisionError"]),
    ("bad-spec", 'factory = "my_eval.score"', ["eval.factory", "module:callable"]),
    ("empty-prompt", 'prompts = ["hi", ""]', ["eval.prompts", "a prompt is empty"]),
    ("bad-budget", 'prompts = ["hi"]\nmax_new_tokens = 0', ["eval.max_new_tokens", ">= 1"]),
]


@pytest.mark.parametrize("case, table, words", CASES, ids=[c[0] for c in CASES])
def test_a_bad_eval_table_is_refused_at_launch(tmp_path: Path, case: str, table: str, words: list[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_eval.py").write_text("def score(model, step):\n    return {}\n\ndef model_only(model):\n    return {}\n")
    (work / "broken_eval.py").write_text("x = 1 / 0\n")
    runs, path = tmp_path / "runs", tmp_path / "p.toml"
    path.write_text(preset_text(runs, work, GPT, 'source = "synthetic"', f"eval_every = 2\n[eval]\n{table}\n"))
    result = runner.invoke(app, ["launch", str(path), "--detach"])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and str(path) in err, err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"
    assert not runs.exists(), "a run directory was created for bad input"


def test_byte_prompts_need_a_byte_vocabulary(tmp_path: Path) -> None:
    runs, path = tmp_path / "runs", tmp_path / "p.toml"
    path.write_text(preset_text(runs, None, GPT.replace("256", "64"), 'source = "synthetic"', '[eval]\nprompts = ["hi"]\n'))
    result = runner.invoke(app, ["launch", str(path), "--detach"])
    assert result.exit_code == 2 and "eval.prompts" in result.stderr and "vocab_size must be >= 256, got 64" in result.stderr, result.stderr
