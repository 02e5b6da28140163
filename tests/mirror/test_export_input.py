"""`mt export` and `[monitor] tensorboard` on bad input: one line naming the thing, exit 2; CSV of a synthetic run."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from tests.cli.conftest import REPO, mt, write_preset
from tests.tui.synth import finished_run


def _mt_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`mt ARGS` in a real process where `module` cannot be imported (an extra not installed)."""
    code = f"import sys; sys.modules[{module!r}] = None; sys.argv = ['mt', *sys.argv[1:]]; from tui.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=120)


def _one_line(p: subprocess.CompletedProcess[str], *words: str) -> None:
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), p.stderr


def test_export_bad_input(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "run", steps=5)
    _one_line(mt("export", tmp_path / "nope", "--csv", tmp_path / "x.csv"), "nope", "no such run directory")
    (tmp_path / "plain").mkdir()
    _one_line(mt("export", tmp_path / "plain", "--csv", tmp_path / "x.csv"), "plain", "not an mt run directory")
    _one_line(mt("export", run.root), "nothing to export")
    _one_line(mt("export", run.root, "--csv", tmp_path / "no" / "x.csv"), "--csv", "no such folder")
    _one_line(mt("export", run.root, "--csv", tmp_path), "--csv", "is a folder")
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o500)
        _one_line(mt("export", run.root, "--csv", tmp_path / "ro" / "x.csv"), "--csv", "permission denied")
    (tmp_path / "afile").write_text("x")
    _one_line(mt("export", run.root, "--tensorboard", tmp_path / "afile"), "--tensorboard", "not a folder")
    assert not (tmp_path / "x.csv").exists()


def test_a_missing_extra_is_named(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "run", steps=5)
    _one_line(_mt_without("pyarrow", "export", run.root, "--parquet", tmp_path / "x.parquet"),
              "--parquet", "parquet extra", 'pip install "mt[parquet]"')
    _one_line(_mt_without("tensorboard", "export", run.root, "--tensorboard", tmp_path / "tb"),
              "--tensorboard", "tensorboard extra")
    assert not (tmp_path / "x.parquet").exists() and not (tmp_path / "tb").exists()
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", monitor={"tensorboard": "tb"})
    _one_line(_mt_without("tensorboard", "launch", preset, "--detach"), "p.toml", "monitor.tensorboard", "tensorboard extra")
    assert not (tmp_path / "runs").exists()   # nothing was created


def test_a_bad_monitor_tensorboard_value(tmp_path: Path) -> None:
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", monitor={"tensorboard": 3})
    _one_line(mt("launch", preset, "--detach"), "p.toml", "monitor.tensorboard", "expected a string")


def test_bad_monitor_wandb_tables(tmp_path: Path) -> None:
    for table, words in (({"entity": "me"}, ("monitor.wandb.project", "missing")),
                         ({"project": "p", "mode": "sometimes"}, ("monitor.wandb.mode", "offline, online, disabled")),
                         ({"project": "p", "key": "secret"}, ("monitor.wandb.key", "unknown key")),
                         ({"project": 3}, ("monitor.wandb.project", "non-empty string")),
                         ({"project": "p", "every_steps": 0}, ("monitor.wandb.every_steps", "expected an integer >= 1, got 0")),
                         ({"project": "p", "every_steps": "10"}, ("monitor.wandb.every_steps", "expected an integer >= 1, got '10'")),
                         ({"project": "p", "every_steps": True}, ("monitor.wandb.every_steps", "expected an integer >= 1, got True")),
                         ({"project": "p", "every_steps": 2.5}, ("monitor.wandb.every_steps", "expected an integer >= 1, got 2.5"))):
        preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", monitor={"wandb": table})
        _one_line(mt("launch", preset, "--detach"), "p.toml", *words)
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", monitor={"wandb": {"project": "p"}})
    _one_line(_mt_without("wandb", "launch", preset, "--detach"), "monitor.wandb", "wandb extra", 'pip install "mt[wandb]"')
    assert not (tmp_path / "runs").exists()


def test_csv_rows_equal_the_run_directory_lines(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "run", steps=40)
    run.event("metrics", step=40, values={"acc": 0.5, "ppl": 3.0})
    run.flush()
    done = mt("export", run.root, "--csv", tmp_path / "x.csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(tmp_path / "x.csv")))
    assert [r["kind"] for r in rows] == ["step"] * 25 + ["eval"] + ["step"] * 15 + ["metrics"]
    assert [r["metrics/acc"] for r in rows if r["kind"] == "metrics"] == ["0.5"]


def test_csv_cells_never_become_formulas_and_numbers_stay_numbers(tmp_path: Path) -> None:
    """OWASP's CSV injection advice: a text cell (or column name) that begins with = + - @ or tab is
    written with a ' before it; CR, NUL and ESC are escaped; a negative loss is still the number -1.5."""
    import json

    run = finished_run(tmp_path / "run", steps=4)
    run.step(5, loss=-1.5)
    run.event("metrics", step=5, values={"=cmd|' /C calc'!A0": 1.0, "-neg": -2.0})
    run.flush()
    hostile = {"code": "-crash", "severity": "error", "step": 5, "status": "open", "source": "supervisor",
               "title": "=HYPERLINK(\"http://x\",\"click\")", "detail": "+1+1\x00tail\x1b[2J", "advice": "@SUM(A1)",
               "t": run.t}
    with open(run.paths.incidents, "a") as f:
        f.write(json.dumps(hostile) + "\n" + json.dumps({**hostile, "title": "\tTAB", "advice": "\rCR", "detail": "ok"}) + "\n")
    done = mt("export", run.root, "--csv", tmp_path / "x.csv")
    assert done.returncode == 0, done.stderr
    raw = (tmp_path / "x.csv").read_bytes()
    assert b"\x00" not in raw and b"\x1b" not in raw
    rows = list(csv.DictReader(open(tmp_path / "x.csv", newline="", encoding="utf-8")))
    assert "metrics/=cmd|' /C calc'!A0" in rows[0], list(rows[0])   # a column name starts with its kind
    step5 = next(r for r in rows if r["kind"] == "step" and r["step"] == "5")
    assert float(step5["loss"]) == -1.5 and step5["loss"] == "-1.5"
    metrics = next(r for r in rows if r["kind"] == "metrics")
    assert metrics["metrics/-neg"] == "-2.0"
    inc, second = (r for r in rows if r["kind"] == "incident")
    assert inc["title"] == "'=HYPERLINK(\"http://x\",\"click\")" and inc["code"] == "'-crash"
    assert inc["detail"] == "'+1+1\\x00tail\\x1b[2J" and inc["advice"] == "'@SUM(A1)"
    assert second["title"] == "'\tTAB" and second["advice"] == "\\x0dCR" and second["detail"] == "ok"
