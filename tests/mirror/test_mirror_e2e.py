"""Real (tiny, CPU) runs with `[monitor] tensorboard` on: stopped and resumed, crashed and restarted
from an older checkpoint; read back with TensorBoard's own reader; `mt export` of the finished run."""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from tests.cli.conftest import events, mt, run_dir_from, status, wait_for, write_preset
from tests.mirror.tbread import assert_mirrors, f32, scalars, texts
from tests.mirror.wbread import offline_runs, series

pytest.importorskip("tensorboard")
pytestmark = pytest.mark.slow
WANDB = {"wandb": {"project": "mt-test", "mode": "offline"}} if importlib.util.find_spec("wandb") else {}


def offline_env(tmp: Path) -> dict[str, str]:
    """W&B offline, its files in tmp: nothing reaches the network."""
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp / "wandb"), "WANDB_SILENT": "true"}


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run shared by the read-only tests: 2 ranks, stopped near step 8, resumed to step 24."""
    tmp = tmp_path_factory.mktemp("mirrored")
    preset = write_preset(tmp / "p.toml", tmp / "runs", monitor={"tensorboard": "tb", **WANDB},
                          train={"eval_every": 8}, faults={"step_sleep_s": 0.15})
    env = offline_env(tmp)
    started = mt("launch", preset, "--detach", env=env)
    assert started.returncode == 0, started.stderr
    run_dir = run_dir_from(started.stdout)
    wait_for(lambda: any(e["step"] >= 6 for e in events(run_dir, "step")), 120, "step 6")
    stopped = mt("stop", run_dir)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    resumed = mt("resume", run_dir, "--headless", env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert status(run_dir)["state"] == "completed" and status(run_dir)["attempt"] == 2
    return run_dir


def test_the_live_mirror_of_a_stopped_and_resumed_run_equals_its_events(resumed_run: Path) -> None:
    got = assert_mirrors(resumed_run / "tb", resumed_run / "events.jsonl")
    assert [s for s, _ in got["train/loss"]] == list(range(1, 25))
    assert [s for s, _ in got["val/loss"]] == [8, 16, 24]
    assert len(list((resumed_run / "tb").glob("events.out.tfevents.*"))) == 2   # one per supervisor
    system = scalars(resumed_run / "tb" / "system")
    samples = [json.loads(line) for line in (resumed_run / "system.jsonl").read_text().splitlines()]
    for rank in (0, 1):   # sample n's value at step n (the samples before the workers started have none)
        want = [(n, f32(r["rss_bytes"])) for n, s in enumerate(samples) for r in s["ranks"] if r["rank"] == rank and r.get("rss_bytes") is not None]
        assert system[f"rank{rank}/rss_bytes"] == want and len(want) > 3
    assert json.loads((resumed_run / "mirror.json").read_text())["tensorboard"]["written"]["train/loss"] == 24


def test_export_tensorboard_of_the_finished_run(resumed_run: Path, tmp_path: Path) -> None:
    done = mt("export", resumed_run, "--tensorboard", tmp_path / "tb")
    assert done.returncode == 0, done.stderr
    got = assert_mirrors(tmp_path / "tb", resumed_run / "events.jsonl")
    assert got == scalars(resumed_run / "tb")
    again = mt("export", resumed_run, "--tensorboard", tmp_path / "tb")
    assert again.returncode == 2 and "already holds TensorBoard event files" in again.stderr


def test_export_csv_and_parquet_hold_every_row(resumed_run: Path, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    done = mt("export", resumed_run, "--csv", tmp_path / "run.csv", "--parquet", tmp_path / "run.parquet")
    assert done.returncode == 0, done.stderr
    evs = events(resumed_run)
    want = {"step": sum(e["kind"] == "step" for e in evs), "eval": sum(e["kind"] == "eval" for e in evs),
            "system": len((resumed_run / "system.jsonl").read_text().splitlines()),
            "incident": len((resumed_run / "incidents.jsonl").read_text().splitlines())
            if (resumed_run / "incidents.jsonl").exists() else 0}
    rows = list(csv.DictReader(open(tmp_path / "run.csv")))
    counts = {k: sum(r["kind"] == k for r in rows) for k in want}
    assert counts == want and len(rows) == sum(want.values())
    steps = [r for r in rows if r["kind"] == "step"]
    assert [float(r["loss"]) for r in steps] == [e["loss"] for e in evs if e["kind"] == "step"]
    assert {r["attempt"] for r in steps} == {"1", "2"}
    table = pq.read_table(tmp_path / "run.parquet").to_pylist()
    assert len(table) == len(rows) and [r["loss"] for r in table if r["kind"] == "step"] == [float(r["loss"]) for r in steps]


def test_an_automatic_restart_from_an_older_checkpoint_purges_the_redone_steps(tmp_path: Path) -> None:
    """Attempt 1 crashes at step 13, attempt 2 restarts from step 8's checkpoint: steps 9-12 twice in
    events.jsonl, once in TensorBoard (the newer values), and the crash as text."""
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", monitor={"tensorboard": str(tmp_path / "tb"), **WANDB},
                          launch={"nproc_per_node": 1, "max_restarts": 1}, train={"max_steps": 16},
                          faults={"crash_at_step": 13})
    done = mt("launch", preset, "--headless", env=offline_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = run_dir_from(done.stdout)
    redone = [e["step"] for e in events(run_dir, "step")]
    assert redone.count(9) == 2, redone
    got = assert_mirrors(tmp_path / "tb", run_dir / "events.jsonl")
    assert [s for s, _ in got["train/loss"]] == list(range(1, 17))
    assert any("crash" in t for t in texts(tmp_path / "tb" / "system"))
    if WANDB:   # one supervisor, one W&B file; the redone steps keep their first values there
        runs = offline_runs(tmp_path / "wandb")
        assert len(runs) == 1
        first: dict[int, float] = {}
        for e in events(run_dir, "step"):
            first.setdefault(e["step"], e["loss"])
        assert series(runs, "train/loss") == sorted(first.items())
        crash = [v for row in runs[0].rows for k, v in row.items() if k.startswith("incidents/")]
        assert any("crash" in v for v in crash), crash   # incidents go to W&B as text, at the newest step


def test_wandb_offline_continues_one_run_across_attempts(resumed_run: Path) -> None:
    """Two supervisors (launch, resume): two offline files of the one W&B run id kept in mirror.json;
    every step once, each value equal to events.jsonl's."""
    if not WANDB:
        pytest.skip("the wandb extra is not installed")
    runs = offline_runs(resumed_run.parents[1] / "wandb")
    kept = json.loads((resumed_run / "mirror.json").read_text())["wandb"]["sink"]["id"]
    assert len(runs) == 2 and {r.run_id for r in runs} == {kept} and {r.project for r in runs} == {"mt-test"}
    steps = events(resumed_run, "step")
    assert series(runs, "train/loss") == [(e["step"], e["loss"]) for e in steps]
    assert series(runs, "train/lr") == [(e["step"], e["lr"]) for e in steps]
    assert [s for s, _ in series(runs, "val/loss")] == [8, 16, 24]
    rss = series(runs, "system/rank1/rss_bytes")
    assert rss and all(v > 0 for _, v in rss)
