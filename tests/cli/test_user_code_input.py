"""A preset naming the user's own code: every problem is one line naming file and key, exit 2, before anything starts."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.cli.conftest import mt, run_dir_from, status
from tests.engine.usercode import work_folder
from tui.cli import app

runner = CliRunner()


def preset_text(runs: Path, work: Path | None, model: str, data: str, extra: str = "") -> str:
    workdir = f"workdir = {str(work)!r}\n" if work else ""
    return (f"[run]\nname = \"u\"\nruns_dir = {str(runs)!r}\n{workdir}"
            "[launch]\nnproc_per_node = 1\ndevice = \"cpu\"\n"
            f"[model]\n{model}\n[data]\n{data}\n"
            "[train]\nmicro_batch_size = 4\nmax_steps = 6\nwarmup_steps = 0\n" + extra)


GOOD_MODEL = 'kind = "python"\nfactory = "my_models:build"\n[model.args]\nhidden = 16'
GOOD_DATA = 'source = "python"\nfactory = "my_data:build"\n[data.args]\nn = 64'

CASES = [
    ("no-module", 'kind = "python"\nfactory = "nope:build"', GOOD_DATA, ["model.factory", "cannot import module 'nope'"]),
    ("no-attribute", 'kind = "python"\nfactory = "my_models:missing"', GOOD_DATA, ["model.factory", "has no attribute 'missing'"]),
    ("not-callable", 'kind = "python"\nfactory = "my_models:not_callable"', GOOD_DATA, ["model.factory", "not callable", "int"]),
    ("bad-arg", 'kind = "python"\nfactory = "my_models:build"\n[model.args]\nwidth = 3', GOOD_DATA,
     ["model.args", "does not accept", "width=3"]),
    ("no-factory", 'kind = "python"', GOOD_DATA, ["model.factory", "required"]),
    ("bad-spec", 'kind = "python"\nfactory = "my_models.build"', GOOD_DATA, ["model.factory", "module:callable"]),
    ("kind-choice", 'kind = "keras"', GOOD_DATA, ["model.kind", "keras"]),
    ("data-no-attribute", GOOD_MODEL, 'source = "python"\nfactory = "my_data:nothing"', ["data.factory", "no attribute 'nothing'"]),
    ("data-bad-arg", GOOD_MODEL, 'source = "python"\nfactory = "my_data:build"\n[data.args]\nrows = 5', ["data.args", "rows=5"]),
    ("collate-missing", GOOD_MODEL, GOOD_DATA.replace("[data.args]", 'collate = "my_data:stack"\n[data.args]'),
     ["data.collate", "no attribute 'stack'"]),
    ("init-from-missing", GOOD_MODEL.replace("[model.args]", 'init_from = "/nonexistent/run"\n[model.args]'), GOOD_DATA,
     ["model.init_from", "no such file or run directory"]),
    ("args-date", GOOD_MODEL + "\nwhen = 2026-12-01", GOOD_DATA, ["model.args.when", "expected a string, number"]),
    ("import-raises", 'kind = "python"\nfactory = "broken:build"', GOOD_DATA, ["model.factory", "importing 'broken' failed", "ZeroDivisionError"]),
    ("factory-raises", 'kind = "python"\nfactory = "my_models:raises"\n[model.args]\nhidden = 16', GOOD_DATA,
     ["model.factory: my_models:raises(hidden=16) raised ValueError: hidden = 16 is not a multiple of 64"]),
    ("data-factory-raises", GOOD_MODEL, 'source = "python"\nfactory = "my_data:unreadable"',
     ["data.factory: my_data:unreadable('train') raised ValueError: no shards under /data/shards"]),
    ("dict-to-positional", 'kind = "python"\nfactory = "my_models:positional"', GOOD_DATA,
     ["model.factory", "a dict with keys ['input_ids', 'labels']", "Positional.forward(input_ids, labels, /)"]),
]


@pytest.mark.parametrize("case, model, data, words", CASES, ids=[c[0] for c in CASES])
def test_bad_user_code_is_rejected_before_anything_exists(tmp_path: Path, case: str, model: str, data: str,
                                                          words: list[str]) -> None:
    work = work_folder(tmp_path)
    (work / "broken.py").write_text("x = 1 / 0\n")
    assert_refused(tmp_path, work, model, data, words)


def assert_refused(tmp_path: Path, work: Path | None, model: str, data: str, words: list[str]) -> str:
    """`mt launch` exits 2 with one line naming the preset and every word, and makes no run."""
    runs = tmp_path / "runs"
    path = tmp_path / "p.toml"
    path.write_text(preset_text(runs, work, model, data))
    result = runner.invoke(app, ["launch", str(path), "--detach"])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and str(path) in err, err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"
    assert not runs.exists(), "a run directory was created for bad input"
    return err


def test_a_factory_not_found_says_where_it_was_looked_for(tmp_path: Path) -> None:
    work_folder(tmp_path)  # my_models.py is there, but mt launch runs here, with no [run] workdir
    assert_refused(tmp_path, None, GOOD_MODEL, GOOD_DATA, ["model.factory", "cannot import module 'my_models'",
                                                           f"looked in {Path.cwd()} (where mt launch ran)", "[run] workdir"])


@pytest.mark.slow
def test_factories_are_found_where_mt_launch_runs_and_a_local_engine_py_is_not_mt(tmp_path: Path) -> None:
    work = work_folder(tmp_path)            # holds an engine.py that exits if anyone imports it
    runs = tmp_path / "runs"
    (work / "p.toml").write_text(preset_text(runs, None, GOOD_MODEL, GOOD_DATA,
                                             "log_every = 1\n[checkpoint]\nevery_steps = 3\n"))
    out = mt("launch", "p.toml", "--headless", cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    run = run_dir_from(out.stdout)
    assert status(run)["state"] == "completed" and "step 6/6" in out.stdout
    assert (run / "checkpoints" / "step-6").is_dir()


HF_CASES = [
    ("hf-unknown-type", 'kind = "hf"\n[model.hf]\nmodel_type = "gpt9"', ["model.hf.model_type", "gpt9"]),
    ("hf-hub-id", 'kind = "hf"\n[model.hf]\npath = "gpt2"', ["model.hf.path", "not a local folder", "never downloads"]),
    ("hf-both", 'kind = "hf"\n[model.hf]\npath = "."\nmodel_type = "gpt2"', ["model.hf", "not both"]),
    ("hf-neither", 'kind = "hf"', ["model.hf", "needs model_type"]),
    ("hf-seq-too-long", 'kind = "hf"\nseq_len = 128\n[model.hf]\nmodel_type = "gpt2"\nn_layer = 1\nn_head = 2\nn_embd = 16\n'
     'vocab_size = 64\nn_positions = 64', ["model.seq_len", "128", "64 positions"]),
]


@pytest.mark.parametrize("case, model, words", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_bad_hf_model_is_rejected_before_anything_exists(tmp_path: Path, case: str, model: str, words: list[str]) -> None:
    err = assert_refused(tmp_path, None, model, 'source = "synthetic"', words)
    assert "factor" not in err and "engine." not in err and "Error:" not in err, err  # no factory here, nor mt's internals
