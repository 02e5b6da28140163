"""Checkpoints are atomic and self-checking: damage is detected and an older intact one is used."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
from pathlib import Path

import pytest
import torch

from engine.checkpoint import full, pick
from engine.checkpoint.folder import hash_files
from mt.contract import checkpoints

from .runner import events, logs, make_run, run_engine

EVERY_3 = {"train": {"max_steps": 9}, "checkpoint": {"every_steps": 3, "keep_last": 5}}


def resume_and_get_start(run, attempt: int = 2) -> dict:
    run_engine(run, attempt=attempt)
    return [e for e in events(run, "run_start") if e["attempt"] == attempt][0]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A run that wrote checkpoints at steps 3, 6 and 9 (trained once per module)."""
    run = make_run(tmp_path_factory.mktemp("pristine"), **EVERY_3)
    assert run_engine(run) == 0, logs(run)
    assert [c["step"] for c in events(run, "checkpoint")] == [3, 6, 9]
    return run


@pytest.fixture
def finished(pristine, tmp_path):
    """A private copy of the pristine run for a test to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "run"))


def make_longer(run, max_steps: int = 12) -> None:
    cfg = json.loads((run / "config.json").read_text())
    cfg["train"]["max_steps"] = max_steps
    (run / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "no_manifest"])
def test_damaged_newest_checkpoint_is_skipped_and_the_previous_used(finished, damage):
    newest = finished / "checkpoints/step-9"
    if damage == "truncate":
        data = (newest / "optim.pt").read_bytes()
        (newest / "optim.pt").write_bytes(data[: len(data) // 2])
    elif damage == "bitflip":
        data = bytearray((newest / "model.pt").read_bytes())
        data[len(data) // 2] ^= 0x01
        (newest / "model.pt").write_bytes(bytes(data))
    else:
        (newest / "manifest.json").unlink()
    make_longer(finished)
    start = resume_and_get_start(finished)
    assert start["start_step"] == 6 and start["resumed_from"]["step"] == 6
    skipped = [e for e in events(finished, "incident") if e["code"] == "checkpoint_skipped"]
    assert len(skipped) == 1 and "step-9" in skipped[0]["evidence"]["path"]
    assert "skipping checkpoint" in (finished / "logs/rank0.log").read_text()
    assert events(finished, "run_end")[-1]["status"] == "completed"


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['PAYLOAD_MARK']}",))


def test_pickle_payload_is_refused_and_never_runs(finished, tmp_path, monkeypatch):
    mark = tmp_path / "payload-ran"
    monkeypatch.setenv("PAYLOAD_MARK", str(mark))
    newest = finished / "checkpoints/step-9"
    (newest / "train.pt").write_bytes(pickle.dumps(Payload()))
    # a forger can make the manifest agree with the file: only weights_only loading stops it
    manifest = json.loads((newest / "manifest.json").read_text())
    import hashlib
    data = (newest / "train.pt").read_bytes()
    manifest["files"]["train.pt"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (newest / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(checkpoints.CheckpointError, match="weights_only"):
        pick.load(newest)
    make_longer(finished)
    start = resume_and_get_start(finished)
    assert start["start_step"] == 6
    assert not mark.exists()


def test_crash_while_writing_a_checkpoint_leaves_the_previous_one_in_use(tmp_path):
    run = make_run(tmp_path, **EVERY_3, faults={"crash_in_checkpoint_at_step": 6})
    assert run_engine(run) != 0
    assert [c["step"] for c in events(run, "checkpoint")] == [3]
    assert not (run / "checkpoints/step-6").exists()
    assert list((run / "checkpoints").glob(".tmp-step-6-*"))  # the half-written folder
    start = resume_and_get_start(run)
    assert start["start_step"] == 3
    assert not list((run / "checkpoints").glob(".tmp-*"))  # cleaned, never taken for a checkpoint
    assert events(run, "run_end")[-1]["status"] == "completed"


def test_retention_keeps_the_newest_and_refuses_foreign_folders(tmp_path):
    run = make_run(tmp_path, train={"max_steps": 10}, checkpoint={"every_steps": 2, "keep_last": 2})
    assert run_engine(run) == 0, logs(run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-10", "step-8"]
    foreign = run / "checkpoints/step-99"
    foreign.mkdir()
    (foreign / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    path, parts, skipped = pick.find_latest(run / "checkpoints")
    assert path.name == "step-10" and "not an mt-checkpoint" in skipped[0][1]
    assert parts["train.pt"]["step"] == 10 and isinstance(parts["train.pt"]["rng"][0]["numpy"][1], list)
    assert isinstance(parts["model.pt"]["tok_emb.weight"], torch.Tensor)


def test_a_symlinked_step_folder_is_never_a_checkpoint(finished, tmp_path):
    """checkpoints/step-99999 -> another run's checkpoint: not listed, not loaded, not shown."""
    from mt.contract.paths import RunPaths
    from tui.read.bulk import newest_checkpoint_dir

    other = Path(shutil.copytree(finished / "checkpoints/step-9", tmp_path / "elsewhere/step-9"))
    (finished / "checkpoints/step-99999").symlink_to(other, target_is_directory=True)
    path, _parts, skipped = pick.find_latest(finished / "checkpoints")
    assert path.name == "step-9" and skipped == []
    assert [p.name for _, p in checkpoints.folders(finished / "checkpoints")] == ["step-9", "step-6", "step-3"]
    listed = checkpoints.folders(finished / "checkpoints", "sizes")
    assert checkpoints.newest(finished / "checkpoints", "sizes").path.name == "step-9" and [s for s, _ in listed] == [9, 6, 3]
    assert newest_checkpoint_dir(RunPaths(finished)).step == 9
    start = resume_and_get_start(finished)
    assert start["start_step"] == 9 and start["resumed_from"]["path"].endswith("step-9")


def _sharded_manifest(folder: Path) -> None:
    """Rewrite `folder`'s manifest as a sharded one listing every file in it (hashes matching)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    names = sorted(p.name for p in folder.iterdir() if p.name != "manifest.json")
    manifest.update(layout="sharded", files=hash_files(folder, names))
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _set_listed(folder: Path, name: str, size: int) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name]["bytes"] = size
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _damage(newest: Path, how: str, elsewhere: Path) -> None:
    """The structurally bad checkpoints of issue #22 item 5 (and a symlinked file, item 18)."""
    manifest = json.loads((newest / "manifest.json").read_text())
    if how == "layout_list":
        manifest["layout"] = ["sharded"]
        (newest / "manifest.json").write_text(json.dumps(manifest))
    elif how == "nul_name":
        (newest / ".metadata").write_bytes(b"x")
        _sharded_manifest(newest)
        manifest = json.loads((newest / "manifest.json").read_text())
        manifest["files"]["a\u0000b"] = {"sha256": "0" * 64, "bytes": 1}
        (newest / "manifest.json").write_text(json.dumps(manifest))
    elif how == "deep":
        (newest / "manifest.json").write_text('{"a": ' * 200_000 + "1" + "}" * 200_000)
    elif how == "folder":
        (newest / "model.pt").unlink()
        (newest / "model.pt").mkdir()
        _set_listed(newest, "model.pt", (newest / "model.pt").stat().st_size)
    elif how == "fifo":
        (newest / "model.pt").unlink()
        os.mkfifo(newest / "model.pt")
        _set_listed(newest, "model.pt", 0)
    elif how == "dev_zero":
        (newest / "model.pt").unlink()
        (newest / "model.pt").symlink_to("/dev/zero")
        _set_listed(newest, "model.pt", 0)
    elif how == "symlinked_shard":  # sharded: a shard file linked from outside, hashes matching
        (newest / ".metadata").write_bytes(b"x")
        (elsewhere / "__0_0.distcp").write_bytes(b"shard")
        (newest / "__0_0.distcp").symlink_to(elsewhere / "__0_0.distcp")
        _sharded_manifest(newest)
    else:  # "symlinked_file": the same bytes, hashes matching, but a link to a file outside the folder
        shutil.move(newest / "model.pt", elsewhere / "model.pt")
        (newest / "model.pt").symlink_to(elsewhere / "model.pt")


DAMAGE = ["layout_list", "nul_name", "deep", "folder", "fifo", "dev_zero", "symlinked_file", "symlinked_shard"]


@pytest.fixture
def alarm():
    """A hang (a FIFO opened, /dev/zero hashed) fails the test after 10 s instead of blocking it."""
    def expired(*_):
        raise TimeoutError("verification hung")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("how", DAMAGE)
def test_a_structurally_bad_newest_checkpoint_is_not_intact_for_any_reader(tmp_path, how, alarm):
    from mt.contract import space
    (tmp_path / "run").mkdir()
    root = tmp_path / "run" / "checkpoints"
    parts = {"model.pt": {"w": torch.ones(64)}, "optim.pt": {}, "train.pt": {"step": 1}}
    older = full.save(root, 1, parts, {}).path
    newest = full.save(root, 2, {**parts, "train.pt": {"step": 2}}, {}).path
    (tmp_path / "elsewhere").mkdir()
    _damage(newest, how, tmp_path / "elsewhere")
    with pytest.raises(checkpoints.CheckpointError) as err:
        checkpoints.verify(newest)
    assert str(err.value).startswith(str(newest)) and "\n" not in str(err.value)
    path, found, skipped = pick.find_latest(root)  # the engine's resume
    assert path == older and found["train.pt"]["step"] == 1 and [p for p, _ in skipped] == [newest]
    found = checkpoints.newest(root)  # `mt resume`
    assert (found.path, [(d.path, d.why) for d in found.damaged]) == (older, [(newest, skipped[0][1].replace(f"{newest}/", "").replace(f"{newest}: ", ""))])
    assert [p for _, p in checkpoints.folders(root, "sizes")] == [older]  # the listing
    room = space.plan_room(root, 3, 1)  # the room planning judges by the intact one
    assert room.needed == space.checkpoint_bytes(older) + space.SLACK_BYTES and space.checkpoint_bytes(newest) is None


def test_a_corrupted_file_under_a_good_manifest_is_passed_over_by_resume_the_pick_and_room_planning(tmp_path, monkeypatch):
    """One flipped byte (same size, wrong sha256): `mt resume`'s check, the engine's pick and the
    room planning all judge by every byte, so none takes it for the newest intact checkpoint, and
    `mt resume` refuses exactly when the engine would find nothing to continue from."""
    from mt.contract import space
    from mt.contract.paths import RunPaths
    from tui.supervise.launch import ResumeError, resume_run

    run = make_run(tmp_path)
    root = RunPaths(run).checkpoints
    parts = {"model.pt": {"w": torch.ones(64)}, "optim.pt": {}, "train.pt": {"step": 1}}
    older = full.save(root, 1, parts, {}).path
    newest = full.save(root, 2, {**parts, "train.pt": {"step": 2}}, {}).path
    data = bytearray((newest / "model.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest / "model.pt").write_bytes(bytes(data))
    assert checkpoints.newest(root, "sizes").path == newest  # the listing checks sizes only: it still counts

    path, _parts, skipped = pick.find_latest(root)  # the engine's pick
    assert path == older and [p for p, _ in skipped] == [newest] and "model.pt: sha256 mismatch" in skipped[0][1]
    found = checkpoints.newest(root)  # what `mt resume` checks
    assert found.path == older and [(d.path, d.message) for d in found.damaged] == skipped
    monkeypatch.setattr(space, "free_bytes", lambda path: 0)
    room = space.plan_room(root, 3, 1)  # keep_last = 1 keeps the newest intact one: the older
    assert room.prune_first == [newest] and not room.fits

    shutil.rmtree(older)  # now the engine would start from step 0: `mt resume` refuses, naming why
    assert pick.find_latest(root)[0] is None
    with pytest.raises(ResumeError, match=r"no checkpoint is intact \(1 checked: step-2: model.pt: sha256 mismatch"):
        resume_run(run)
    assert not (run / "status.json").exists()  # nothing started
