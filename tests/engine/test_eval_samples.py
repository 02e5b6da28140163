"""[eval] prompts and factory in real runs: samples decoded with the run's own tokenizer, the same
after a crash and resume, the training untouched by them; a factory's numbers in the eval event,
a failing factory an incident while the run goes on."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.corpus import write_corpus
from tests.engine.runner import events, make_run, run_engine

BYTES_MODEL = {"vocab_size": 256, "dropout": 0.1}  # dropout: the training draws from the global RNG every step
PROMPTS = {"prompts": ["hello", "The "], "max_new_tokens": 8, "temperature": 1.0}


def _samples(run: Path) -> dict[tuple[int, int], dict[str, Any]]:
    return {(e["step"], e["index"]): e for e in events(run, "sample")}


def _losses(run: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events(run, "step")}


@pytest.mark.slow
def test_samples_repeat_after_a_crash_and_resume_and_leave_the_training_as_it_was(tmp_path: Path) -> None:
    train = {"max_steps": 8, "eval_every": 4}
    data = {"val_fraction": 0.1}
    full = make_run(tmp_path, "full", model=BYTES_MODEL, data=data, train=train, eval=PROMPTS)
    assert run_engine(full) == 0
    crashed = make_run(tmp_path, "crashed", model=BYTES_MODEL, data=data, train=train, eval=PROMPTS,
                       checkpoint={"every_steps": 4}, faults={"crash_at_step": 6})
    assert run_engine(crashed) != 0
    assert run_engine(crashed, attempt=2) == 0
    plain = make_run(tmp_path, "plain", model=BYTES_MODEL, data=data, train=train)
    assert run_engine(plain) == 0

    got = _samples(full)
    assert sorted(got) == [(4, 0), (4, 1), (8, 0), (8, 1)]
    for (step, i), e in got.items():
        assert e["prompt"] == PROMPTS["prompts"][i] and e["tokens"] == 8 and isinstance(e["text"], str)
    assert got[(4, 0)]["text"] != got[(8, 0)]["text"]  # sampled at temperature 1: another step, another draw
    again = _samples(crashed)  # step 4 by the first attempt, step 8 by the resumed one
    assert {k: e["text"] for k, e in again.items()} == {k: e["text"] for k, e in got.items()}
    # the samples drew from a forked RNG: every step's loss is the one a run without prompts had
    assert _losses(full) == _losses(plain) and len(_losses(full)) == 8
    assert [e["step"] for e in events(full, "eval")] == [4, 8]


@pytest.mark.slow
def test_samples_decode_with_the_runs_tokenizer_file(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    text = write_corpus(tmp_path / "corpus.txt", 40_000)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train([str(text)], tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"]))
    tok.decoder = tokenizers.decoders.BPEDecoder()
    tok_path = tmp_path / "tok.json"
    tok.save(str(tok_path))
    ids = tok.encode(text.read_text()).ids
    cache = tmp_path / "tokens.bin"
    np.asarray(ids, dtype=np.uint16).tofile(cache)
    run = make_run(tmp_path, "run", model={"vocab_size": 320, "seq_len": 32},
                   data={"source": "text", "path": str(text), "tokenizer": str(tok_path), "token_cache": str(cache)},
                   train={"max_steps": 4, "eval_every": 4},
                   eval={"prompts": ["the"], "max_new_tokens": 6, "temperature": 0.0})
    assert run_engine(run) == 0
    (sample,) = events(run, "sample")
    assert sample["step"] == 4 and sample["tokens"] == 6 and sample["text"]
    # the tokenizer's decoding of 6 of its pieces: text it reads back to itself, in the corpus' letters
    got = sample["text"]
    assert tok.decode(tok.encode(got).ids) == got and len(tok.encode(got).ids) <= 6, got
    assert set(got) <= set(text.read_text()) and "\ufffd" not in got, got  # not bytes: pieces decode whole


FACTORY = '''
    import torch

    def accuracy(model, step):
        x = torch.zeros(1, 4, dtype=torch.long)
        return {"accuracy": 1.0 / step, "mean_logit": float(model(x).mean()), "step_seen": step}

    def broken(model, step):
        if step == 4:
            raise RuntimeError("the held-out set is gone")
        return {"ok": 1.0}

    def not_numbers(model, step):
        return ["accuracy", 0.5]
'''


@pytest.mark.slow
@pytest.mark.parametrize("fn", ["accuracy", "broken", "not_numbers"])
def test_the_factory_numbers_go_in_the_eval_event_and_a_failing_one_is_an_incident(tmp_path: Path, fn: str) -> None:
    (tmp_path / "my_eval.py").write_text(textwrap.dedent(FACTORY))
    run = make_run(tmp_path, "run", model={"vocab_size": 256}, data={"val_fraction": 0.1},
                   run={"name": "t", "seed": 7, "workdir": str(tmp_path)},
                   train={"max_steps": 8, "eval_every": 4}, eval={"factory": f"my_eval:{fn}"})
    assert run_engine(run) == 0  # the run goes on whatever the factory does
    evals = {e["step"]: e for e in events(run, "eval")}
    assert sorted(evals) == [4, 8] and all(e["val_loss"] > 0 for e in evals.values())
    incidents = [e for e in events(run, "incident") if e["code"] == "eval_failed"]
    if fn == "accuracy":
        assert evals[4]["metrics"]["accuracy"] == 0.25 and evals[8]["metrics"]["step_seen"] == 8
        assert isinstance(evals[8]["metrics"]["mean_logit"], float) and not incidents
        from tui.read.bulk import bulk_read
        for how in ("index", "scan"):   # the engine's index holds val_loss only: an eval with metrics is read from its line
            if how == "scan":
                (run / "events.idx").unlink()
            res = bulk_read(run)
            assert (res.from_index > 0) == (how == "index"), how
            x, y = res.series.extra["eval/accuracy"].arrays()
            assert x.tolist() == [4, 8] and y.tolist() == [0.25, 0.125], how
            assert res.state.evals.metrics == evals[8]["metrics"] and res.state.val_loss == evals[8]["val_loss"], how
    elif fn == "broken":
        assert "metrics" not in evals[4] and evals[8]["metrics"] == {"ok": 1.0}
        (inc,) = incidents
        assert inc["step"] == 4 and "my_eval:broken" in inc["detail"] and "the held-out set is gone" in inc["detail"]
    else:
        assert all("metrics" not in e for e in evals.values()) and len(incidents) == 2
        assert "my_eval:not_numbers" in incidents[0]["detail"] and "not a dict" in incidents[0]["detail"]


def _bpe(text: Path, vocab: int) -> Any:
    """A small byte-level BPE trained offline on `text`."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train([str(text)], tokenizers.trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    return tok


@pytest.mark.slow
def test_an_hf_model_samples_with_its_own_folders_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    from tests.engine.usercode import GPT2, hf_base

    tok = _bpe(write_corpus(tmp_path / "corpus.txt", 40_000), 300)
    folder = tmp_path / "tiny-gpt2"
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**{**GPT2, "vocab_size": tok.get_vocab_size()})).save_pretrained(folder)
    run = make_run(tmp_path, "run", hf_base({"path": str(folder)}), train={"max_steps": 2, "eval_every": 2},
                   checkpoint={"every_steps": 2}, eval={"prompts": ["Kalo mi"], "max_new_tokens": 5, "temperature": 0.0})
    assert run_engine(run) == 0
    (sample,) = events(run, "sample")
    assert sample["prompt"] == "Kalo mi" and sample["tokens"] == 5
    # the same greedy continuation, by hand: the step-2 weights, the folder's tokenizer
    hf_tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.load_state_dict(torch.load(run / "checkpoints" / "step-2" / "model.pt", map_location="cpu"))
    ids = torch.tensor([hf_tok.encode("Kalo mi", add_special_tokens=False)])
    out = model.eval().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert sample["text"] == hf_tok.decode(out[0, ids.shape[1]:]) and len(ids[0]) < len("Kalo mi")  # BPE pieces, not bytes


GENERATES = '''
    import torch
    from torch import nn
    import torch.nn.functional as F


    class Bigram(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(256, 256)

        def forward(self, x, y):
            return F.cross_entropy(self.table(x).view(-1, 256), y.reshape(-1))

        def generate(self, idx, max_new_tokens, temperature=1.0):
            for _ in range(max_new_tokens):
                probs = F.softmax(self.table(idx[:, -1]) / max(temperature, 1e-3), dim=-1)
                idx = torch.cat([idx, torch.multinomial(probs, 1)], dim=1)
            return idx


    class Mute(Bigram):
        generate = None


    def build(generates=True):
        return Bigram() if generates else Mute()
'''


@pytest.mark.slow
@pytest.mark.parametrize("generates", [True, False])
def test_a_factory_model_samples_through_its_own_generate(tmp_path: Path, generates: bool) -> None:
    (tmp_path / "bigram.py").write_text(textwrap.dedent(GENERATES))
    run = make_run(tmp_path, "run", model={"kind": "python", "factory": "bigram:build", "args": {"generates": generates},
                                           "vocab_size": 256},
                   run={"name": "t", "seed": 7, "workdir": str(tmp_path)}, train={"max_steps": 2, "eval_every": 2},
                   eval={"prompts": ["ab"], "max_new_tokens": 4})
    assert run_engine(run) == 0
    failed = [e for e in events(run, "incident") if e["code"] == "eval_failed"]
    if generates:
        (sample,) = events(run, "sample")
        assert sample["tokens"] == 4 and not failed
    else:  # no generate: an incident saying so, no sample, the run done
        assert not events(run, "sample") and len(failed) == 1 and "has no generate" in failed[0]["detail"]


@pytest.mark.slow
def test_two_ranks_under_ddp_and_fsdp_write_the_same_samples_once(tmp_path: Path) -> None:
    """ddp: rank 0 alone generates while rank 1 waits in the eval's all_reduce; fsdp: both ranks run
    the sharded model's forwards, rank 0 writes. Same weights, same seeds: the same samples."""
    got = {}
    for strategy in ("ddp", "fsdp"):
        run = make_run(tmp_path, strategy, model={"vocab_size": 256}, data={"val_fraction": 0.1},
                       train={"max_steps": 4, "eval_every": 2, "strategy": strategy}, eval=PROMPTS)
        assert run_engine(run, nproc=2) == 0
        got[strategy] = {k: e["text"] for k, e in _samples(run).items()}
        assert sorted(got[strategy]) == [(2, 0), (2, 1), (4, 0), (4, 1)]  # once each: rank 0's
    assert got["ddp"] == got["fsdp"]
