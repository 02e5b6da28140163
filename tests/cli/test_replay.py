"""`mt replay`: real runs with a planted fault (a module, a gradient, the loss, a poisoned sample, a
spike), replayed in processes of their own; the report names the planted module, says whether the
losses were reproduced bit for bit, and the incident shows the cause. The run's own files stay as they were."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import events, mt, wait_for, write_preset

# a corrupt record: sample POISON's features at 1e36, which `energy` (h * h) takes past float32's range
PLANTED = '''
import os
import torch
from torch import nn
from torch.utils.data import Dataset

POISON = 37


class Points(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = torch.randn(8, generator=torch.Generator().manual_seed(i))
        return (x * 1e36 if i == POISON else x), x.sum()


def points(split):
    return Points() if split == "train" else None


class Square(nn.Module):
    def forward(self, h):
        return h * h


class Net(nn.Module):
    def __init__(self, noisy=False):
        super().__init__()
        self.enc = nn.Linear(8, 16)
        self.energy = Square()
        self.head = nn.Linear(16, 1)
        self.noisy = noisy

    def forward(self, x, y):
        out = self.head(self.energy(self.enc(x)) * 1e-3).squeeze(-1)
        loss = ((out - y) ** 2).mean()
        if self.noisy:  # a value no seed fixes: as a nondeterministic kernel would give
            loss = loss + int.from_bytes(os.urandom(2), "little") * 1e-7
        return loss


def build(noisy=False):
    return Net(noisy)
'''


def _python_model(tmp_path: Path, noisy: bool = False) -> dict[str, Any]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "planted.py").write_text(PLANTED)
    return {"run": {"workdir": str(work)},
            "model": {"kind": "python", "factory": "planted:build", "args": {"noisy": noisy}},
            "data": {"source": "python", "factory": "planted:points"}}


def _launch(tmp_path: Path, **sections: dict[str, Any]) -> Path:
    runs = tmp_path / "runs"
    preset = write_preset(tmp_path / "p.toml", runs, **sections)
    res = mt("launch", preset, "--headless", "--every", "0", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return run


def _fingerprint(run: Path) -> dict[str, str]:
    """The run's own files, byte for byte: what a replay must leave as it found them."""
    names = ["events.jsonl", "status.json", "config.json", "incidents.jsonl"]
    files = [run / n for n in names if (run / n).exists()] + sorted((run / "checkpoints").rglob("*"))
    return {str(f.relative_to(run)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def _replay(run: Path, *args: str) -> tuple[dict[str, Any], str]:
    before = _fingerprint(run)
    res = mt("replay", run, *args, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _fingerprint(run) == before, "the replay changed the run's own files"
    (folder,) = sorted((run / "replay").iterdir())
    return json.loads((folder / "report.json").read_text()), res.stdout


GPT = {"model": {"n_layer": 2}, "train": {"max_steps": 14}, "checkpoint": {"every_steps": 5}}
ONE = {"launch": {"nproc_per_node": 1}}

CASES = {
    # (preset sections, the module the report must name, its phase)
    "forward-nan-rank1-accum": ({**GPT, "train": {"max_steps": 14, "grad_accum_steps": 2},
                                 "faults": {"module": "blocks.1.mlp", "module_at_step": 12, "module_fault": "nan", "module_rank": 1}},
                                "blocks.1.mlp", "forward"),
    "forward-inf": ({**GPT, **ONE, "faults": {"module": "blocks.0.attn", "module_at_step": 8, "module_fault": "inf"}},
                    "blocks.0.attn", "forward"),
    "gradient-nan": ({**GPT, **ONE, "faults": {"module": "blocks.0.mlp.fc", "module_at_step": 9, "module_fault": "grad_nan"}},
                     "blocks.0.mlp.fc", "backward"),
    "loss-nan": ({**GPT, **ONE, "faults": {"nan_at_step": 11}}, "(loss)", "loss"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_replay_names_the_planted_module(tmp_path: Path, case: str) -> None:
    sections, module, phase = CASES[case]
    run = _launch(tmp_path, **sections)
    (nan,) = [e for e in events(run, "incident") if e["code"] == "nan_loss"]
    report, out = _replay(run)
    assert (report["kind"], report["module"], report["phase"]) == ("nonfinite", module, phase), out
    assert report["step"] == report["bad_step"] == nan["step"]
    assert report["from_step"] == 5 * ((nan["step"] - 1) // 5)   # the newest checkpoint before the incident
    # the micro-batch's dataset indices: among the ones the incident named, where its loss was NaN; a
    # gradient gone NaN leaves the losses finite, so the incident names none and only the replay does
    named = set(nan["evidence"]["sample_indices"])
    assert report["sample_indices"] and (set(report["sample_indices"]) <= named if phase != "backward" else not named)
    assert report["reproduced"] is True and report["compared"] >= 1 and "reproduced bit for bit" in out, out
    cause = "the loss was the first non-finite value" if phase == "loss" else f"{module}: first non-finite"
    assert f"cause: {cause}" in out
    summary = mt("watch", run, "--once").stdout
    assert f"cause (mt replay): {cause}" in summary, summary


# on_nan = "stop": the run stops at the NaN with a checkpoint of the step before it (keep_last would
# have removed the older ones by the end of the epoch)
POISONED = {"launch": {"nproc_per_node": 1}, "train": {"max_steps": 64, "micro_batch_size": 4, "on_nan": "stop"},
            "checkpoint": {"every_steps": 2}}


@pytest.mark.slow
def test_a_poisoned_sample_is_named_with_its_layer(tmp_path: Path) -> None:
    run = _launch(tmp_path, **_python_model(tmp_path), **POISONED)
    (nan,) = [e for e in events(run, "incident") if e["code"] == "nan_loss"]
    assert nan["evidence"]["sample_indices"] and 37 in nan["evidence"]["sample_indices"]
    report, out = _replay(run)
    assert report["from_step"] == nan["step"] - 1   # the stop's checkpoint: the state before the NaN step
    assert (report["module"], report["phase"]) == ("energy", "forward"), out
    assert 37 in report["sample_indices"] and report["reproduced"] is True, out


@pytest.mark.slow
def test_a_spike_names_the_module_whose_norm_jumped(tmp_path: Path) -> None:
    run = _launch(tmp_path, **GPT, **ONE, faults={"module": "blocks.1.attn", "module_at_step": 12, "module_fault": "spike"})
    report, out = _replay(run, "--step", "12")
    assert (report["kind"], report["module"], report["phase"]) == ("spike", "blocks.1.attn", "forward"), out
    assert report["from_step"] <= 12 - 3 and report["ratio"] > 10, report   # a median of at least 2 earlier steps
    assert report["reproduced"] is True


@pytest.mark.slow
def test_a_step_that_does_not_repeat_points_at_the_machine(tmp_path: Path) -> None:
    run = _launch(tmp_path, **_python_model(tmp_path, noisy=True), launch={"nproc_per_node": 1},
                  train={"max_steps": 8, "micro_batch_size": 4}, checkpoint={"every_steps": 4})
    report, out = _replay(run, "--step", "7")
    assert report["reproduced"] is False and report["difference"]["step"] == 5, out
    assert "NOT reproduced" in out and "points at the machine" in out


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run = _launch(tmp_path, **ONE, train={"max_steps": 10}, checkpoint={"every_steps": 5})
    for args, says in [((), "no NaN or spike incident"), (("--step", "99"), "past the run (its last step is 10)"),
                       (("--step", "4"), "no intact checkpoint before step 4"), (("--step", "0"), "expected a step >= 1")]:
        res = mt("replay", run, *args)
        assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, (args, res.stderr)
    assert not (run / "replay").exists()
    res = mt("replay", tmp_path)
    assert res.returncode == 2 and "not an mt run directory" in res.stderr


@pytest.mark.slow
def test_a_live_run_is_not_replayed_beside_itself(tmp_path: Path) -> None:
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", **ONE, train={"max_steps": 500},
                          checkpoint={"every_steps": 2}, faults={"step_sleep_s": 0.2})
    run = Path(mt("launch", preset, "--detach").stdout.strip())
    try:
        wait_for(lambda: (run / "checkpoints" / "step-2").is_dir(), 120, "the live run's first checkpoint")
        res = mt("replay", run, "--step", "3")
        assert res.returncode == 2 and "the run is live" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not (run / "replay").exists()
    finally:
        mt("kill", run)


@pytest.mark.slow
def test_replay_on_nan_gives_the_incident_its_cause(tmp_path: Path) -> None:
    run = _launch(tmp_path, **GPT, **ONE, monitor={"replay_on_nan": True},
                  faults={"module": "blocks.1.mlp.proj", "module_at_step": 7, "module_fault": "nan"})
    report = run / "replay" / "step-7" / "report.json"
    wait_for(report.exists, 240, "the supervisor's replay report")   # the supervisor replays once the run has ended
    assert json.loads(report.read_text())["module"] == "blocks.1.mlp.proj"
    cause = "cause (mt replay): blocks.1.mlp.proj: first non-finite forward output"
    assert cause in mt("watch", run, "--once").stdout
    assert cause in mt("watch", run, "--headless").stdout   # the incident's lines, then the cause
    # the dashboard's incident panel: the incident the viewer read, with the cause its follower found
    from tui.read.follower import load_run_state
    from tui.state.runstate import cause_of
    from tui.widgets.incidents import incident_detail

    st = load_run_state(run)
    (nan,) = [i for i in st.incidents if i.code == "nan_loss"]
    assert cause in str(incident_detail(nan, cause_of(st.causes, nan)))


def test_a_report_that_is_not_a_file_is_never_read(tmp_path: Path) -> None:
    from tui.read.replay import Causes

    good, fifo = tmp_path / "replay" / "step-4", tmp_path / "replay" / "step-9"
    good.mkdir(parents=True)
    fifo.mkdir()
    os.mkfifo(fifo / "report.json")   # a FIFO: opening it for reading would block a plain reader
    (good / "report.json").write_text(json.dumps({"step": 4, "kind": "nonfinite", "module": "blocks.0.attn", "phase": "forward",
                                                  "rank": 0, "micro_batch": 1, "bad_step": 4, "sample_indices": [3, 5]}))
    assert Causes(tmp_path).poll() == {4: "blocks.0.attn: first non-finite forward output (step 4, rank 0, micro-batch 1; samples 3, 5)"}
