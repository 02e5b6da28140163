"""`mt doctor` on this machine, and the shipped tiny preset end to end."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from mt.contract.events import EVENT_FIELDS, SCHEMA, schema_errors
from mt.contract.preset import load_preset
from tests.cli.conftest import REPO, events, mt, run_dir_from, status, toml_text
from tests.cli.test_startup import _probe
from tests.engine.runner import index_problem

pytestmark = pytest.mark.slow


def test_doctor_checks_torch_and_a_gloo_group_without_importing_torch_itself() -> None:
    res = _probe("doctor")
    assert "TORCH_FREE" in res.stderr, res.stderr
    lines = res.stdout.splitlines()
    assert any(l.startswith("ok ") and "torch 2." in l for l in lines), lines
    assert any("2-process gloo group starts" in l for l in lines), lines
    assert any("NVML" in l or "GPU " in l for l in lines), lines
    failed = [l for l in lines if l.startswith("FAIL")]
    assert res.stderr.strip().endswith(f"TORCH_FREE {1 if failed else 0}"), (lines, res.stderr)


def test_real_tiny_preset_trains_and_every_event_matches_schema(tmp_path: Path) -> None:
    # the shipped preset (the README's first run) through mt launch --headless: its model, data and
    # optimiser as written, cut to 24 of its 150 steps (evals and checkpoints every 12) to fit the
    # suite's time; its loss is past 3 by step 20 (from 5.5), so the learning check has a wide margin
    real = REPO / "presets" / "tiny-cpu.toml"
    tables = tomllib.loads(real.read_text())
    tables["train"].update(max_steps=24, eval_every=12)
    tables["checkpoint"]["every_steps"] = 12
    preset = tmp_path / "tiny-cpu.toml"
    preset.write_text(toml_text(tables))
    (tmp_path / "tmp").mkdir()  # its own temp dir, to prove torchrun leaves nothing there
    res = mt("launch", preset, "--headless", "--every", "3600", "--runs-dir", tmp_path / "runs", timeout=600, env={"TMPDIR": str(tmp_path / "tmp")})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    run_dir = run_dir_from(res.stdout)
    st = status(run_dir)
    assert st["state"] == "completed" and st["exit_code"] == 0 and st["attempt"] == 1
    cfg = json.loads((run_dir / "config.json").read_text())
    want = load_preset(real).to_dict()
    want["train"].update(max_steps=24, eval_every=12)
    want["checkpoint"]["every_steps"] = 12
    assert {k: v for k, v in cfg.items() if k != "run"} == {k: v for k, v in want.items() if k != "run"}
    assert cfg["run"]["name"] == "tiny-cpu"

    lines = (run_dir / "events.jsonl").read_text().splitlines()
    for line in lines:
        assert schema_errors(json.loads(line)) == [], line
    end = events(run_dir, "run_end")[-1]
    assert end["status"] == "completed" and end["step"] == 24
    steps = events(run_dir, "step")
    assert [s["step"] for s in steps] == list(range(1, 25))
    first, last = steps[0]["loss"], sum(s["loss"] for s in steps[-5:]) / 5
    assert first > 5.0 and last < first - 1.5, (first, last)  # it learns
    start = events(run_dir, "run_start")[0]
    # the required fields first, in the schema's order, as a script's run_start has them (tests/library/test_library.py)
    assert list(start)[3:21] == list(EVENT_FIELDS["run_start"]) and set(start) - {"v", "t", "kind"} <= {f.name for f in SCHEMA["run_start"]}
    assert start["world_size"] == 2 and start["effective_batch"] == 2 * 8 * 2
    assert start["tokens_per_step"] == 2 * 8 * 2 * 128
    assert 0 < start["data_loss_floor"] < last
    assert [e["step"] for e in events(run_dir, "eval")] == [12, 24]
    assert [c["reason"] for c in events(run_dir, "checkpoint")] == ["interval", "final"]
    assert all(s["samples_seen"] == s["step"] * 32 for s in steps)
    assert all(s["data_wait_s"] >= 0 and s["tokens_per_s"] > 0 for s in steps)
    for rank in (0, 1):
        beat = json.loads((run_dir / f"heartbeat/rank{rank}").read_text())
        assert beat["step"] == 24 and beat["rank"] == rank
    assert index_problem(run_dir / "events.jsonl") is None

    # the headless log is compact: with --every longer than the run, the first step seen and the last
    # (a time-based throttle: at the default 1 s a loaded machine's 1.5 s steps each get their line)
    step_lines = [l for l in res.stdout.splitlines() if l.startswith("step ")]
    assert len(step_lines) == 2 and step_lines[-1].startswith("step 24/24"), step_lines
    # layout: private folder, preset copy, worker logs, supervisor log, system samples
    assert (run_dir.stat().st_mode & 0o777) == 0o700
    private = [p for p in run_dir.rglob("*") if p.is_file()]
    assert private and {p.relative_to(run_dir).as_posix(): oct(p.stat().st_mode & 0o777) for p in private
                        if p.stat().st_mode & 0o077} == {}     # every file 0600 (supervisor.log was 0644)
    assert (run_dir / "preset.toml").read_text() == preset.read_text()
    for rank in (0, 1):
        assert (run_dir / "logs" / f"rank{rank}.log").is_file()
    assert "state completed" in (run_dir / "logs" / "supervisor.log").read_text()
    left = [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith(("torchelastic_", "mt-torchrun-"))]
    assert left == []  # torchrun's scratch is removed (torchinductor_* is torch's cache: it stays)
    samples = [json.loads(l) for l in (run_dir / "system.jsonl").read_text().splitlines()]
    assert samples, "no system samples"
    for s in samples:
        assert s["v"] == 1 and isinstance(s["nvml"], bool) and "host" in s and "gpus" in s
        assert s["nvml"] or s["nvml_error"]
    live = [r for s in samples for r in s["ranks"] if r["alive"]]
    assert {r["rank"] for r in live} == {0, 1}
    assert all(r["rss_bytes"] > 0 and r["cpu_pct"] is not None for r in live)
    _ls_copes_with_foreign_and_broken_folders(tmp_path / "runs", run_dir, 24)


def _ls_copes_with_foreign_and_broken_folders(runs: Path, good: Path, max_steps: int) -> None:
    (runs / "holiday-photos").mkdir()
    broken = runs / "broken-run"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "status.json").write_text("[1, 2")
    (broken / "events.jsonl").write_bytes(b"\x00\xff garbage\n{\"kind\": 3}\n")
    ls = mt("ls", runs)
    assert ls.returncode == 0 and "Traceback" not in ls.stderr
    lines = ls.stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "STATE"]
    assert any(l.startswith("holiday-photos") and "(not a run)" in l for l in lines)
    assert any(l.startswith("broken-run") for l in lines)
    assert any(l.startswith(good.name) and "completed" in l and f"{max_steps}/{max_steps}" in l for l in lines)
    once = mt("watch", broken, "--once")
    assert once.returncode == 0 and "Traceback" not in once.stderr
