"""`mt diff`, `mt ls --sort` and `mt watch A B --once` as real processes on real run directories.

The diff's runs are made by mt launch's own code (`create_run`): config.json is the resolved
config written before any training, so no run has to train for its config to be compared.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.cli.conftest import mt, write_preset
from tests.tui.conftest import FIXTURES
from tui.supervise.launch import Overrides, create_run


def test_diff_lists_exactly_the_two_keys_two_presets_differ_in(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    a = create_run(write_preset(tmp_path / "a.toml", runs), Overrides(name="a"))
    b = create_run(write_preset(tmp_path / "b.toml", runs, train={"lr": 3e-3}, model={"n_layer": 2}),
                   Overrides(name="a"))
    res = mt("diff", a, b)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[2] == "config: 2 keys differ"
    keys = [line.split() for line in lines[4:6]]
    assert keys == [["model.n_layer", "1", "2"], ["train.lr", "0.001", "0.003"]], res.stdout
    assert lines[6].split()[:3] == ["world", "size", "2"]   # both ask for 2 (config; not started)
    assert [line.split()[:2] for line in lines[7:]] == [["final", "loss"], ["best", "loss"]]

    # recorded runs: the losses they reached
    res = mt("diff", FIXTURES / "finished", FIXTURES / "incidents")
    assert res.returncode == 0, res.stderr
    assert "final loss              0.9932       1.3384" in res.stdout
    assert "best loss               0.9630 @140  1.3378 @43" in res.stdout
    assert "train.max_steps         150          60" in res.stdout

    res = mt("diff", a, tmp_path / "nope")
    assert res.returncode == 2 and res.stderr.strip() == f"mt: {tmp_path / 'nope'}: no such run directory"
    (b / "config.json").write_text("{broken")
    res = mt("diff", a, b)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and str(b / "config.json") in res.stderr


def test_ls_sorts_by_best_loss_name_or_start_and_compare_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    # newest first by default: incidents (best 1.3378), then finished (0.9630), then a run with no steps
    fresh = create_run(write_preset(tmp_path / "p.toml", runs), Overrides(name="fresh"))
    for age, name in ((300, "finished"), (200, "incidents")):
        shutil.copytree(FIXTURES / name, runs / name)
        os.utime(runs / name / "preset.toml", (1e9 + 1000 - age, 1e9 + 1000 - age))
    os.utime(fresh / "preset.toml", (1e9 + 1000, 1e9 + 1000))

    def names(*args: str) -> list[str]:
        res = mt("ls", runs, *args)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert lines[0].split() == ["NAME", "STATE", "ATTEMPT", "STEP", "LOSS", "BEST", "STARTED", "DURATION"]
        return [line.split()[0] for line in lines[1:]]

    assert names() == names("--sort", "started") == [fresh.name, "incidents", "finished"]
    assert names("--sort", "loss") == ["finished", "incidents", fresh.name]
    assert names("--sort", "name") == sorted(names())
    bad = mt("ls", runs, "--sort", "size")
    assert bad.returncode == 2 and "--sort" in bad.stderr

    once = mt("watch", runs / "finished", runs / "incidents", "--once")
    assert once.returncode == 0, once.stderr
    assert [line.split()[:3] for line in once.stdout.splitlines()] == [
        ["RUN", "STATE", "STEP"], ["finished", "completed", "150/150"], ["incidents", "failed", "44/60"]]
    many = mt("watch", *[runs / "finished"] * 9)
    assert many.returncode == 2 and many.stderr == "mt: 9 runs: the compare view overlays at most 8\n"


def test_config_diff_flattens_tables_and_names_keys_one_side_lacks() -> None:
    from tui.report.diff import MISSING, config_diff

    a = {"train": {"lr": 1, "clip": 1.0}, "data": {"path": "x"}, "launch": {"env": {}}}
    b = {"train": {"lr": 1.0, "clip": 1.0}, "model": {"layers": [2, 2]}, "launch": {"env": {}}}
    assert config_diff(a, b) == [("data.path", '"x"', MISSING), ("model.layers", MISSING, "[2, 2]"),
                                 ("train.lr", "1", "1.0")]
    assert config_diff(a, a) == []
