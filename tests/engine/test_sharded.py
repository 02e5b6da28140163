"""Sharded (DCP) checkpoints: bitwise resume, async writes killed mid-way, resharding onto another
world size, damaged shards skipped, and a hostile checkpoint that runs nothing."""
from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from engine.checkpoint import folder, full, pick, sharded
from engine.weights import read_state
from mt.contract import checkpoints
from mt.contract.checkpoints import CheckpointError

from .runner import SMALL, events, final_weights, finish, logs, make_run, merge, run_engine, start, steps_by_attempt

# 16 samples a step (2 ranks x 4 x 2 accumulation); every source of per-rank state is on
BASE = merge(SMALL, {
    "train": {"strategy": "fsdp", "max_steps": 12},
    "data": {"synthetic_samples": 256},
    "checkpoint": {"every_steps": 4, "keep_last": 2},
    "debug": {"trace_samples": True},
})


def _samples_by_step(run: Path) -> dict[int, list[int]]:
    """Every sample index each step trained on, over all ranks and attempts (a repeat shows twice)."""
    out: dict[int, list[int]] = {}
    for path in sorted(run.glob("trace/rank*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out.setdefault(rec["step"], []).extend(i for mb in rec["micro_batches"] for i in mb)
    return {s: sorted(v) for s, v in out.items()}


def _stop_at_next_step(run: Path) -> None:
    (run / "control").mkdir(exist_ok=True)
    (run / "control" / "stop-1.json").write_text(json.dumps({"id": "stop-1", "action": "stop", "t": 0}))


@pytest.mark.slow
def test_sharded_async_kill_resumes_bitwise_and_reshards_two_to_one_to_two(tmp_path):
    # one chain of runs proves it all (each start costs seconds):
    # 1. async, 2 ranks, a checkpoint every 2 steps: step 2's background write fails (an incident,
    #    training goes on); rank 0 dies (SIGKILL) in the background commit of step 8, after its
    #    train.pt: step-6 stays the newest checkpoint and resumes bit for bit (against a reference);
    # 2. that step-4 (2 ranks' shards) resumes on 1 rank, which stops at step 5 (1 rank's shards);
    # 3. a newer copy with a truncated shard is skipped; step 5 resumes on 2 ranks to the end.
    reference = make_run(tmp_path, "reference", BASE)
    ref_proc = start(reference, nproc=2)
    run = make_run(tmp_path, "killed", BASE, checkpoint={"async": True, "every_steps": 2},
                   faults={"fail_checkpoint_at_step": 2, "crash_in_checkpoint_at_step": 8})
    assert run_engine(run, nproc=2) != 0
    first = events(run, "checkpoint")
    assert [c["step"] for c in first] == [4, 6]
    assert all(0 < c["blocking_s"] <= c["seconds"] for c in first)
    [failed] = [e for e in events(run, "incident") if e["code"] == "checkpoint_failed"]
    assert failed["step"] == 2 and "injected write failure" in failed["detail"] and "\n" not in failed["detail"]
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if not p.name.startswith(".tmp-step-8-")) == ["step-4", "step-6"]
    assert list(ckpts.glob(".tmp-step-8-*")), "the half-written step 8 stays a temporary folder"

    moved = make_run(tmp_path, "reshard", BASE)
    shutil.copytree(ckpts / "step-4", moved / "checkpoints" / "step-4")
    _stop_at_next_step(moved)
    to_one = start(moved, nproc=1)                                 # 2 -> 1, beside the killed run's resume
    assert run_engine(run, nproc=2, attempt=2) == 0, logs(run)
    assert finish(to_one, moved, 240) == 0, logs(moved)

    start2 = [e for e in events(run, "run_start") if e["attempt"] == 2][0]
    assert start2["resumed_from"]["path"].endswith("step-6") and start2["resumed_from"]["exact"] is True
    assert not list(ckpts.glob(".tmp-*"))
    assert finish(ref_proc, reference, 240) == 0, logs(reference)
    ref = {s["step"]: s for s in events(reference, "step")}
    after = steps_by_attempt(run)[2]
    assert [s["step"] for s in after] == list(range(7, 13))
    for s in after:
        assert (s["loss"], s["grad_norm"], s["samples_seen"]) == (ref[s["step"]]["loss"], ref[s["step"]]["grad_norm"], ref[s["step"]]["samples_seen"]), s["step"]
    a, b = final_weights(reference), final_weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    weights, _ = read_state(run)  # init_from a run whose checkpoints are sharded
    assert all(torch.equal(weights[k], a[k]) for k in a)
    last = events(run, "checkpoint")[-1]
    assert last["reason"] == "final" and last["t"] <= events(run, "run_end")[-1]["t"]  # the end waited for it

    mine = moved / "checkpoints"
    assert sorted(os.listdir(mine / "step-5")) == [".metadata", "__0_0.distcp", "manifest.json", "train.pt"]
    shutil.copytree(mine / "step-5", mine / "step-6")  # newer, with a truncated shard: passed over
    with open(mine / "step-6" / "__0_0.distcp", "r+b") as f:
        f.truncate(100)
    cfg = json.loads((moved / "config.json").read_text())
    cfg["checkpoint"]["format"] = "full"  # ... and reads the sharded one, writes full ones
    (moved / "config.json").write_text(json.dumps(cfg))
    assert run_engine(moved, nproc=2, attempt=2) == 0, logs(moved)  # 1 -> 2
    starts = {e["attempt"]: e for e in events(moved, "run_start")}
    assert starts[1]["resumed_from"]["world_size_before"] == 2 and starts[1]["resumed_from"]["grad_accum_now"] == 4
    assert starts[2]["resumed_from"]["path"].endswith("step-5") and starts[2]["resumed_from"]["world_size_before"] == 1
    skipped = [e for e in events(moved, "incident") if e["code"] == "checkpoint_skipped"]
    assert len(skipped) == 1 and "step-6/__0_0.distcp" in skipped[0]["detail"] and "truncated" in skipped[0]["detail"]
    assert [s["samples_seen"] for s in events(moved, "step")] == [16 * k for k in range(5, 13)]
    want = _samples_by_step(reference)
    assert _samples_by_step(moved) == {s: want[s] for s in range(5, 13)}  # the same samples in every step
    for s in events(moved, "step"):  # resharded weights and moments: the same run up to float sum order
        assert s["loss"] == pytest.approx(ref[s["step"]]["loss"], rel=1e-4), s["step"]
    assert (Path(events(moved, "checkpoint")[-1]["path"]) / "model.pt").exists()
    full = final_weights(moved)
    assert full.keys() == a.keys() and all(torch.allclose(full[k], a[k], rtol=1e-4, atol=1e-5) for k in a)


class _Marker:
    """Pickles to a call of os.system: what a hostile checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_hostile_metadata_and_byte_items_are_refused_and_run_nothing(tmp_path):
    marker = tmp_path / "ran"
    root = tmp_path / "checkpoints"
    older = full.save(root, 1, {"model.pt": {"w": torch.ones(2)}, "optim.pt": {}, "train.pt": {"step": 1}}, {})
    # a newer "sharded" checkpoint whose manifest is consistent (an attacker rewrites it too)
    # but whose .metadata calls os.system when unpickled
    tmp = folder.begin(root, 2)
    (tmp / ".metadata").write_bytes(pickle.dumps(_Marker(marker)))

    def write(into: Path) -> dict:
        return {**full.write_parts(into, {"train.pt": {"step": 2}}), **folder.hash_files(into, [".metadata"])}

    folder.commit(root, 2, tmp, write, {"layout": "sharded"})
    path, parts, skipped = pick.find_latest(root)
    assert path == older.path and parts["model.pt"]["w"].sum() == 2
    [(where, why)] = skipped
    assert where.name == "step-2" and "refused by the metadata unpickler" in why and "posix.system" in why
    assert "\n" not in why and not marker.exists()

    # a byte item (DCP pickles non-tensors with torch.save) that calls os.system when loaded
    real = tmp_path / "dcp"
    dcp.save({"w": torch.arange(4.0), "evil": _Marker(marker)}, checkpoint_id=real, no_dist=True)
    md = sharded.read_metadata(real)   # a real .metadata passes the restricted unpickler
    assert set(md.state_dict_metadata) == {"w", "evil"}
    state = {"w": torch.zeros(4), "evil": None}
    with pytest.raises(CheckpointError, match="item evil: refused by weights_only load: .*GLOBAL posix.system") as refused:
        sharded.read_into(state, real, no_dist=True)
    assert "\n" not in str(refused.value) and not marker.exists()

    # the same files as a newest checkpoint whose hashes match: passed over while choosing (an
    # incident, the older one used), never a failed collective load that ends the run
    tmp = folder.begin(root, 3)
    for f in real.iterdir():
        shutil.copy(f, tmp / f.name)

    def write_real(into: Path) -> dict:
        names = sorted(p.name for p in into.iterdir())
        return {**full.write_parts(into, {"train.pt": {"step": 3}}), **folder.hash_files(into, names)}

    folder.commit(root, 3, tmp, write_real, {"layout": "sharded"})
    checkpoints.verify(root / "step-3")
    path, _parts, skipped = pick.find_latest(root)
    assert path == older.path and [p.name for p, _ in skipped] == ["step-3", "step-2"]
    assert "item evil: refused by weights_only load" in skipped[0][1] and not marker.exists()

    dcp.load(state, checkpoint_id=real, no_dist=True)  # DCP's own reader would have run it
    assert marker.exists()


def test_restricted_unpickler_refuses_what_dcp_metadata_never_holds():
    for payload in (pickle.dumps(io.BytesIO(b"x")), b"not a pickle", pickle.dumps({"a": 1})):
        with pytest.raises(CheckpointError, match="^x/.metadata: "):
            sharded.unpickle_metadata(payload, "x/.metadata")
