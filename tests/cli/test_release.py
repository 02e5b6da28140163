"""`mt release`: the chosen checkpoint as a folder loadable without mt (safetensors, or an HF model's
own folder), and each refusal one line, exit 2, nothing written."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mt.contract import checkpoints
from mt.contract.preset import load_config_json
from tests.cli.conftest import mt
from tests.engine.runner import SMALL, events, make_run, merge, run_engine
from tests.engine.usercode import GPT2, hf_base

EVAL = {"data": {"val_fraction": 0.1}, "train": {"max_steps": 12, "eval_every": 4, "eval_batches": 2},
        "checkpoint": {"every_steps": 4, "keep_last": 1, "keep_best": 1}}


def trained(tmp_path: Path, name: str = "run", base: dict = SMALL, **over: dict) -> Path:
    run = make_run(tmp_path, name, merge(base, EVAL), **over)
    assert run_engine(run) == 0, (run / "launcher-1.log").read_text()
    return run


def best_step(run: Path) -> tuple[int, float]:
    """The lowest eval among the checkpoint steps, as the run measured it."""
    saved = {e["step"] for e in events(run, "checkpoint")}
    evals = {e["step"]: e["val_loss"] for e in events(run, "eval") if e["step"] in saved}
    step = min(evals, key=lambda s: (evals[s], s))
    return step, evals[step]


def checkpoint_model(run: Path, step: int) -> dict[str, torch.Tensor]:
    with open(run / "checkpoints" / f"step-{step}" / "model.pt", "rb") as f:   # the test's own read of what it compares
        return torch.load(f, map_location="cpu", weights_only=True)


def refused(*args: object, where: Path) -> str:
    """`mt release ARGS` refused: one line on stderr, exit 2, and `where` (DIR's parent) unchanged."""
    before = sorted(p.name for p in where.iterdir()) if where.exists() else None
    done = mt("release", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "nothing was written" in done.stderr or "requirement" in done.stderr
    after = sorted(p.name for p in where.iterdir()) if where.exists() else None
    assert after == before, f"{where} changed: {before} -> {after}"
    return done.stderr.strip()


@pytest.mark.slow
def test_the_best_checkpoint_released_loads_into_a_fresh_model(tmp_path: Path) -> None:
    run = trained(tmp_path)
    step, value = best_step(run)
    out = tmp_path / "out"
    done = mt("release", run, "--to", out, "--require", f"val_loss < {value + 1}", "--require", f"val_loss >= {value - 1}")
    assert done.returncode == 0, done.stderr
    assert f"released step {step} (best)" in done.stdout
    assert {"model.safetensors", "config.json", "release.json", "eval.json", "samples.json", "incidents.json",
            "README.md"} <= {p.name for p in out.iterdir()}
    # a fresh model from the released config, the released weights, equal to the checkpoint's
    cfg = load_config_json(run / "config.json")
    from engine.kinds import kind_of

    model = kind_of(cfg).build(cfg)
    assert json.loads((out / "config.json").read_text())["model"] == cfg.to_dict()["model"]
    model.load_state_dict(load_file(str(out / "model.safetensors")))
    want = checkpoint_model(run, step)
    assert model.state_dict().keys() == want.keys()
    assert all(torch.equal(model.state_dict()[k], want[k]) for k in want)
    assert json.loads((out / "eval.json").read_text())["numbers"] == {"val_loss": value}
    meta = json.loads((out / "release.json").read_text())
    assert meta["step"] == step and meta["chosen"] == "best" and meta["checkpoint"]["best"]["value"] == value
    assert "load_file" in (out / "README.md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]   # the temporary folder was renamed


@pytest.mark.slow
def test_each_refusal_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    run = trained(tmp_path)
    step, value = best_step(run)
    out = tmp_path / "out"
    assert "val_loss < " in refused(run, "--to", out, "--require", f"val_loss < {value - 1}", where=tmp_path)
    assert "no accuracy at that step" in refused(run, "--to", out, "--require", "accuracy > 0.5", where=tmp_path)
    assert "expected NAME OP NUMBER" in refused(run, "--to", out, "--require", "val_loss ~ 2", where=tmp_path)
    assert "no checkpoint step-5" in refused(run, "--step", 5, "--to", out, where=tmp_path)
    # the preset's [release] require is judged the same way
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "release": {"require": [f"val_loss > {value + 1}"]}}))
    assert f"val_loss > {value + 1:g} not met" in refused(run, "--to", out, where=tmp_path)
    (run / "config.json").write_text(json.dumps(config))
    # DIR that exists is never replaced
    out.mkdir()
    assert "already exists" in refused(run, "--to", out, where=tmp_path)
    out.rmdir()
    # a checkpoint whose bytes no longer match its manifest
    model_pt = run / "checkpoints" / f"step-{step}" / "model.pt"
    data = bytearray(model_pt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model_pt.write_bytes(bytes(data))
    assert "sha256 mismatch" in refused(run, "--to", out, where=tmp_path)
    assert "sha256 mismatch" in refused(run, where=run)   # the default DIR, RUN/release/step-S, neither


@pytest.mark.slow
def test_a_non_finite_loss_before_it_refuses_until_the_run_went_back_before_it(tmp_path: Path) -> None:
    run = trained(tmp_path, faults={"nan_at_step": 6}, checkpoint={"every_steps": 2, "keep_last": 10, "keep_best": 0})
    assert any(e["step"] == 6 and e["loss"] == "nan" for e in events(run, "step"))
    assert "a non-finite loss at step 6" in refused(run, "--to", tmp_path / "out", where=tmp_path)
    # a rollback to step 4 written after step 12's checkpoint does not clean that checkpoint's history
    late = shutil.copytree(run, tmp_path / "late")
    with open(late / "events.jsonl", "a") as f:   # the rollback event's shape (the rollback helper's contract)
        f.write(json.dumps({"v": 1, "t": time.time(), "kind": "rollback", "step": 12, "to_step": 4, "skip_batches": 0,
                            "lr_scale": 1.0, "why": "test", "by": "user", "count": 1}) + "\n")
    assert "a non-finite loss at step 6" in refused(late, "--to", tmp_path / "out", where=tmp_path)
    released = mt("release", run, "--step", 4, "--to", tmp_path / "before")    # before the NaN: fine
    assert released.returncode == 0, released.stderr
    # back before it: the checkpoints after step 4 removed, a resume from step 4 retrains 5..12 (no NaN now)
    for s, p in checkpoints.folders(run / "checkpoints"):
        if s > 4:
            shutil.rmtree(p)
    assert run_engine(run, attempt=2) == 0, (run / "launcher-2.log").read_text()
    again = mt("release", run, "--step", 12, "--to", tmp_path / "after")
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
def test_an_open_error_incident_before_it_refuses(tmp_path: Path) -> None:
    """A background checkpoint write that failed (checkpoint_failed, an error, open: no supervisor
    closed it) precedes the later checkpoints: they are refused, the ones before it are not."""
    run = trained(tmp_path, checkpoint={"format": "sharded", "async": True, "every_steps": 4, "keep_last": 10, "keep_best": 0},
                  faults={"fail_checkpoint_at_step": 8})
    assert [e["step"] for e in events(run, "incident") if e["code"] == "checkpoint_failed"] == [8]
    assert "open error incident checkpoint_failed at step 8" in refused(run, "--to", tmp_path / "out", where=tmp_path)
    assert mt("release", run, "--step", 4, "--to", tmp_path / "before").returncode == 0
    assert load_file(str(tmp_path / "before" / "model.safetensors"))


@pytest.mark.slow
def test_a_hugging_face_run_is_released_as_its_own_save_pretrained_folder(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    run = trained(tmp_path, base=hf_base(GPT2), checkpoint={"keep_best": 0, "keep_last": 1})
    out = tmp_path / "hf"
    done = mt("release", run, "--to", out)
    assert done.returncode == 0, done.stderr
    assert "released step 12 (newest)" in done.stdout
    model = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    want = checkpoint_model(run, 12)
    got = model.state_dict()
    assert want.keys() <= got.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    assert "from_pretrained" in (out / "README.md").read_text()


@pytest.mark.slow
def test_an_hf_run_is_released_with_its_folders_tokenizer(tmp_path: Path) -> None:
    """The released folder loads with from_pretrained for the model and the tokenizer alike, and the
    tokenizer encodes as the run's own folder did (a downstream user needs both)."""
    transformers = pytest.importorskip("transformers")
    from tests.corpus import write_corpus
    from tests.engine.test_eval_samples import _bpe

    tok = _bpe(write_corpus(tmp_path / "corpus.txt", 40_000), 300)
    folder = tmp_path / "tiny-gpt2"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    config = transformers.AutoConfig.for_model(**{**GPT2, "vocab_size": tok.get_vocab_size()})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    run = trained(tmp_path, base=hf_base({"path": str(folder)}), checkpoint={"keep_best": 0, "keep_last": 1})
    out = tmp_path / "hf"
    done = mt("release", run, "--to", out)
    assert done.returncode == 0, done.stderr
    released = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    own = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    text = "Kalo mi the corpus"
    assert released.encode(text) == own.encode(text) and len(own.encode(text)) < len(text)  # BPE pieces, not bytes
    model = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert model.config.vocab_size == tok.get_vocab_size()
