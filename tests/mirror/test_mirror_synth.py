"""The TensorBoard mirror over synthetic run directories (no training): resume, rollback, damage, export."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mt.contract.paths import RunPaths
from tests.mirror.tbread import assert_mirrors, scalars, texts
from tests.tui.synth import SynthRun, event_line, finished_run, loss_at
from tui.mirror.mirror import export_tensorboard, open_tensorboard, save_states

pytest.importorskip("tensorboard")


def _append(path: Path, lines: list[str]) -> None:
    with open(path, "a") as f:
        f.writelines(line + "\n" for line in lines)


def _sample(t: float, cpu: float) -> str:
    return json.dumps({"v": 1, "t": t, "nvml": False, "gpus": [],
                       "ranks": [{"rank": 0, "pid": 10, "cpu_pct": cpu, "rss_bytes": 1000 + int(cpu), "alive": True}],
                       "host": {"cpu_pct": 50.0}})


def test_export_of_a_finished_run_equals_its_events(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "run", steps=60)
    run.lines.append(event_line("step", run.t + 1, partial=True, step=61, loss=1.0, extra={"acc": 0.75}))  # run.step(acc=...)
    run.lines.append(event_line("metrics", run.t + 2, step=61, values={"ppl": 2.5}))                     # run.log(...)
    run.flush()
    export_tensorboard(run.paths, tmp_path / "tb")
    got = assert_mirrors(tmp_path / "tb", run.paths.events)
    assert [s for s, _ in got["train/loss"]] == list(range(1, 62))
    assert got["metrics/acc"] == [(61, 0.75)] and got["metrics/ppl"] == [(61, 2.5)]
    assert [s for s, _ in got["val/loss"]] == [25, 50]


def test_a_rollback_purges_the_redone_steps_and_a_new_mirror_continues(tmp_path: Path) -> None:
    """Attempt 1 reaches step 30, attempt 2 restarts from step 20 (its checkpoint) with other
    values; a second mirror (a new supervisor, `mt resume`) picks up from mirror.json."""
    run = SynthRun(tmp_path / "run")
    run.run_start(attempt=1)
    for s in range(1, 31):
        run.step(s)
    run.flush()
    paths, logdir = run.paths, tmp_path / "run" / "tb"
    m = open_tensorboard(paths, logdir, paths.mirror)
    m.poll()
    _append(paths.system, [_sample(run.t, 10.0), "not json", _sample(run.t + 1, 20.0)])
    _append(paths.incidents, [json.dumps({"t": run.t, "code": "crash", "severity": "error", "step": 30, "title": "Rank 0 crashed",
                                          "detail": "RuntimeError", "advice": "see logs", "status": "open", "source": "supervisor"})])
    run.lines = []
    run.run_start(attempt=2, start_step=20)
    for s in range(21, 26):
        run.step(s, loss=loss_at(s) + 1.0)   # redone steps: other values
    _append(paths.events, run.lines)
    m.poll()
    save_states(paths.mirror, {"tensorboard": m})
    m.close()
    run.lines = []
    for s in range(26, 41):
        run.step(s, loss=loss_at(s) + 1.0)
    _append(paths.events, run.lines)
    m2 = open_tensorboard(paths, logdir, paths.mirror)   # what a resumed supervisor does
    m2.poll()
    save_states(paths.mirror, {"tensorboard": m2})
    m2.close()
    got = assert_mirrors(logdir, paths.events)
    assert [s for s, _ in got["train/loss"]] == list(range(1, 41))
    system = scalars(logdir / "system")
    assert system["rank0/cpu_pct"] == [(0, 10.0), (1, 20.0)]
    assert any("Rank 0 crashed" in t for t in texts(logdir / "system"))
    assert json.loads(paths.mirror.read_text())["tensorboard"]["written"]["train/loss"] == 40


def test_damaged_state_and_files_never_stop_the_mirror(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "run", steps=10)
    run.paths.mirror.write_text("{not json")
    _append(run.paths.events, ['{"kind": "step", "step": "x"}', "\x00\x01", '{"v": 1, "kind": "step"}'])
    run.paths.system.write_text("garbage\n[1, 2]\n")
    m = open_tensorboard(run.paths, tmp_path / "tb", run.paths.mirror)
    m.poll()
    m.close()
    assert [s for s, _ in scalars(tmp_path / "tb")["train/loss"]] == list(range(1, 11))


def test_the_mirror_state_is_for_one_folder(tmp_path: Path) -> None:
    """mirror.json of another log folder (the preset changed) starts the new folder from the beginning."""
    run = finished_run(tmp_path / "run", steps=5)
    for name in ("a", "b"):
        m = open_tensorboard(run.paths, tmp_path / name, RunPaths(run.root).mirror)
        m.poll()
        m.close()
        assert len(scalars(tmp_path / name)["train/loss"]) == 5


def _state(logdir: Path, **change: object) -> dict[str, object]:
    """A mirror.json entry that is whole but for `change`: it claims steps 1-5 done and events read to the end."""
    entry = {"target": str(logdir.resolve()), "events": [10 ** 6, None], "system": [0, None], "incidents": [0, None],
             "written": {"train/loss": 5}, "samples": 0, "sink": {}, "v": 1, **change}
    return {"tensorboard": entry}


DAMAGE: dict[str, object] = {
    "negative-offset": {"events": [-5, None]},
    "offset-not-a-number": {"events": ["0", None]},
    "inode-a-float": {"events": [0, 1.5]},
    "step-too-big-for-a-number": "1e400",
    "step-negative": {"written": {"train/loss": -7}},
    "written-a-list": {"written": [["train/loss", 5]]},
    "samples-true": {"samples": True},
    "samples-a-string": {"samples": "3"},
    "sink-a-list": {"sink": []},
    "whole-file-a-list": "[1, 2]",
    "a-fifo": "fifo",
    "a-link-to-another-runs-state": "link",
}


@pytest.mark.timeout(120)   # a FIFO read with open() would wait for a writer for ever
@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_mirror_json_starts_the_mirror_over(tmp_path: Path, damage: str) -> None:
    """docs/run-directory.md Mirrors: a damaged mirror.json (wrong types, out of range, not a regular
    file, a link) starts that mirror over from the run's beginning, and the next save makes it whole."""
    run = finished_run(tmp_path / "run", steps=12)
    paths, logdir, how = run.paths, tmp_path / "tb", DAMAGE[damage]
    if how == "fifo":
        os.mkfifo(paths.mirror)
    elif how == "link":   # whole, but another run's: following it would skip every step here
        other = tmp_path / "other.json"
        other.write_text(json.dumps(_state(logdir)))
        paths.mirror.symlink_to(other)
    elif isinstance(how, str):
        paths.mirror.write_text(how if how.startswith("[") else
                                json.dumps(_state(logdir)).replace('"train/loss": 5', f'"train/loss": {how}'))
    else:
        paths.mirror.write_text(json.dumps(_state(logdir, **how)))
    m = open_tensorboard(paths, logdir, paths.mirror)
    m.poll()
    save_states(paths.mirror, {"tensorboard": m})
    m.close()
    assert [s for s, _ in scalars(logdir)["train/loss"]] == list(range(1, 13))
    saved = json.loads(paths.mirror.read_text())["tensorboard"]
    assert saved["written"]["train/loss"] == 12 and saved["events"][0] == paths.events.stat().st_size
