"""`mt diff A B --first-divergence` on real engine runs: where two runs part, and which checkpoint
tensors differ around that step (the engine's comparison in a process of its own)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from tests.cli.conftest import mt
from tests.engine.runner import SMALL, events, finish, logs, make_run, run_engine, start

# 12 steps, a checkpoint every 2, an eval every 4; warmup 4: until step 4 the schedule is the
# warmup's alone, so "constant" and "cosine" give the same learning rate there and part at step 5
BASE = {"data": {"val_fraction": 0.1}, "train": {"warmup_steps": 4, "eval_every": 4, "eval_batches": 1},
        "checkpoint": {"every_steps": 2, "keep_last": 10}}


def divergence(a: Path, b: Path) -> list[str]:
    """The --first-divergence lines (after the config table), exit 0 asserted."""
    res = mt("diff", a, b, "--first-divergence")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(("first divergence", "identical through", "no step")))
    return lines[at:]


def differing_tensors(a: Path, b: Path) -> list[str]:
    """The test's own answer: model.pt's tensors that differ bit for bit, in the file's (the model's) order."""
    sa, sb = (torch.load(p / "model.pt", weights_only=True) for p in (a, b))
    return [k for k in sa if not torch.equal(sa[k].reshape(-1).view(torch.uint8), sb[k].reshape(-1).view(torch.uint8))]


@pytest.mark.slow
def test_same_seed_is_identical_and_a_schedule_change_parts_at_its_step(tmp_path: Path) -> None:
    runs = {name: make_run(tmp_path, name, SMALL, **{**BASE, "train": {**BASE["train"], **over}})
            for name, over in (("a", {}), ("a2", {}), ("const", {"schedule": "constant"}), ("sparse", {"log_every": 5}))}
    procs = {name: start(run) for name, run in runs.items()}
    for name, proc in procs.items():
        assert finish(proc, runs[name]) == 0, logs(runs[name])

    same = divergence(runs["a"], runs["a2"])
    assert same == ["identical through step 12 (the last both logged; compared: loss, grad_norm, lr, val_loss "
                    "at 12 steps both logged)"], same
    # log_every 5 logs steps 5, 10 and the last, evals at 4, 8, 12: compared at 4, 5, 8, 10, 12
    sparse = divergence(runs["a"], runs["sparse"])
    assert sparse[0].startswith("identical through step 12 (the last both logged;") and "at 5 steps" in sparse[0], sparse

    lines = divergence(runs["a"], runs["const"])
    assert lines[0].startswith("first divergence: step 5 (equal through step 4;"), lines
    lr = [e["lr"] for e in events(runs["a"], "step") if e["step"] == 5] + [
        e["lr"] for e in events(runs["const"], "step") if e["step"] == 5]
    assert lines[1] == f"  lr: A {lr[0]!r}  B {lr[1]!r}  |A-B| {abs(lr[0] - lr[1]):.3g}  relative {abs(lr[0] - lr[1]) / max(lr):.3g}"
    assert lines[2].startswith("checkpoint "), lines   # only lr differs at step 5: its loss came from the same weights
    # step-4 holds the weights both reached before the schedules differ; step-6 those after
    assert re.fullmatch(r"checkpoint step-4 \(at or before the divergence\): identical \(\d+ tensors\)", lines[2]), lines
    ck = [runs[n] / "checkpoints" / "step-6" for n in ("a", "const")]
    want = differing_tensors(*ck)
    assert want, "a different learning rate at step 5 changed no weight"
    assert lines[3].startswith(f"checkpoint step-6 (after the divergence): {len(want)} of "), lines
    shown = [line.split()[0] for line in lines[4:] if not line.startswith("  ...")]
    assert shown == want[:8], (shown, want)   # the first in the model's order first


@pytest.mark.slow
def test_sharded_checkpoints_are_compared_too(tmp_path: Path) -> None:
    from engine.checkpoint import sharded

    ck = {**BASE["checkpoint"], "format": "sharded"}
    runs = [make_run(tmp_path, name, SMALL, **{**BASE, "checkpoint": ck, "train": {**BASE["train"], **over}})
            for name, over in (("a", {}), ("const", {"schedule": "constant"}))]
    procs = [start(run) for run in runs]
    for run, proc in zip(runs, procs):
        assert finish(proc, run) == 0, logs(run)
    lines = divergence(*runs)
    assert lines[0].startswith("first divergence: step 5"), lines
    assert re.fullmatch(r"checkpoint step-4 \(at or before the divergence\): identical \(\d+ tensors\)", lines[2]), lines
    a, b = (sharded.model_state(r / "checkpoints" / "step-6") for r in runs)
    want = [k for k in a if not torch.equal(a[k], b[k])]
    assert want and lines[3].startswith(f"checkpoint step-6 (after the divergence): {len(want)} of {len(a)} tensors differ"), lines
    assert [line.split()[0] for line in lines[4:4 + min(8, len(want))]] == want[:8], (lines, want)


@pytest.mark.slow
def test_a_resumed_run_is_compared_on_the_steps_it_kept(tmp_path: Path) -> None:
    """Attempt 1 logs a NaN at step 10 and dies at 11; attempt 2 (faults are the first attempt's
    only) goes back to step 8 and logs 9 to 12 clean: the run's own values equal a clean run's."""
    clean = make_run(tmp_path, "clean", SMALL, **BASE)
    proc = start(clean)
    faulty = make_run(tmp_path, "faulty", SMALL, **{**BASE, "checkpoint": {"every_steps": 4}},
                      faults={"nan_at_step": 10, "crash_at_step": 11})
    assert run_engine(faulty) != 0
    assert finish(proc, clean) == 0, logs(clean)
    assert run_engine(faulty, attempt=2) == 0, logs(faulty)
    logged = [e["step"] for e in events(faulty, "step")]
    assert logged.count(9) == 2 and logged.count(10) == 2, logged   # steps 9 and 10 twice in events.jsonl
    lines = divergence(clean, faulty)
    assert lines[0].startswith("identical through step 12 (the last both logged;"), lines

    # a checkpoint damaged after the run wrote it is not loaded: said in one line, the rest stands
    other = make_run(tmp_path, "const", SMALL, **{**BASE, "train": {**BASE["train"], "schedule": "constant"}})
    assert run_engine(other) == 0, logs(other)
    model = other / "checkpoints" / "step-6" / "model.pt"
    data = bytearray(model.read_bytes())
    data[-100] ^= 1
    model.write_bytes(bytes(data))
    lines = divergence(clean, other)
    assert lines[0].startswith("first divergence: step 5"), lines
    assert lines[3] == f"checkpoint step-6 (after the divergence): not compared: {model}: sha256 mismatch (corrupted)", lines


@pytest.mark.slow
def test_one_rank_against_two_ranks_of_the_same_global_batch(tmp_path: Path) -> None:
    """"One GPU fine, eight GPUs worse": the same 16 samples a step, on one rank (4 micro-batches
    of 4) and on two (2 each, gloo's all-reduce): where they part, and by how much."""
    one = make_run(tmp_path, "one", SMALL, **{**BASE, "train": {**BASE["train"], "grad_accum_steps": 4}})
    two = make_run(tmp_path, "two", SMALL, **BASE, launch={"nproc_per_node": 2})
    p1, p2 = start(one), start(two, nproc=2)
    assert finish(p1, one) == 0, logs(one)
    assert finish(p2, two) == 0, logs(two)
    res = mt("diff", one, two, "--first-divergence")
    assert res.returncode == 0, res.stderr
    print(res.stdout)   # the measured answer, for the report
    lines = res.stdout.splitlines()
    assert any(ln.split() == ["world", "size", "1", "2"] for ln in lines), lines
    head = next(ln for ln in lines if ln.startswith(("first divergence", "identical through")))
    if head.startswith("first divergence"):
        gaps = lines[lines.index(head) + 1:]
        rel = [float(g.rsplit("relative ", 1)[1]) for g in gaps if g.startswith("  ") and "relative" in g]
        # the same mathematics summed in another order: float rounding, not another run
        assert rel and max(rel) < 1e-3, lines


def test_a_missing_run_or_one_without_events_is_one_line(tmp_path: Path) -> None:
    fresh = make_run(tmp_path, "fresh", SMALL)
    other = make_run(tmp_path, "other", SMALL)
    res = mt("diff", fresh, tmp_path / "nope", "--first-divergence")
    assert res.returncode == 2 and res.stderr == f"mt: {tmp_path / 'nope'}: no such run directory\n"
    res = mt("diff", fresh, other, "--first-divergence")
    assert res.returncode == 2, res.stdout
    assert res.stderr == f"mt: {fresh / 'events.jsonl'}: no events to compare (the run never started)\n"
    (fresh / "events.jsonl").write_text('{"v":1,"kind":"run_end","t":1765000000.0,"step":0,"status":"failed","reason":"x"}\n')
    shutil.copy(fresh / "events.jsonl", other / "events.jsonl")
    res = mt("diff", fresh, other, "--first-divergence")
    assert res.returncode == 2 and res.stderr == f"mt: {fresh / 'events.jsonl'}: no logged step to compare\n"
