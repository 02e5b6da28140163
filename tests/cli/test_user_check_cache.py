"""A passed factory check is remembered beside the runs and reused while nothing it rests on
changed; an edited factory module is checked again (and refused when broken). Real files, the
real check subprocess."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mt.contract.config import ConfigError
from tests.cli.test_user_code_input import GOOD_DATA, GOOD_MODEL, preset_text
from tests.engine.usercode import work_folder
from tui.supervise import usercheck
from tui.supervise.launch import Overrides, create_run, resolve_config


def test_a_passed_check_is_reused_until_a_file_it_imported_changes(tmp_path: Path) -> None:
    work = work_folder(tmp_path)
    runs = tmp_path / "runs"
    preset = tmp_path / "p.toml"
    preset.write_text(preset_text(runs, work, GOOD_MODEL, GOOD_DATA))

    first = create_run(preset, Overrides())
    entries = list(usercheck.cache_dir(runs).glob("*.json"))
    assert len(entries) == 1, entries
    files = json.loads(entries[0].read_text())["files"]
    assert str(work / "my_models.py") in files and str(work / "my_data.py") in files, files
    assert any(p.endswith(os.path.join("torch", "__init__.py")) for p in files), files

    _, again = resolve_config(preset, Overrides())
    assert again is not None and again.cached, "the second launch ran the check again"

    # the key is the preset's model and data sections: other args are checked on their own
    preset.write_text(preset_text(runs, work, GOOD_MODEL.replace("hidden = 16", "width = 3"), GOOD_DATA))
    with pytest.raises(ConfigError) as e:
        resolve_config(preset, Overrides())
    assert e.value.key == "model.args" and "width=3" in e.value.message
    preset.write_text(preset_text(runs, work, GOOD_MODEL, GOOD_DATA))

    # the factory renamed: same preset, but a file the check imported changed, so it runs again
    models = work / "my_models.py"
    models.write_text(models.read_text().replace("def build(", "def build_renamed("))
    with pytest.raises(ConfigError) as e:
        create_run(preset, Overrides())
    assert e.value.key == "model.factory" and "has no attribute 'build'" in e.value.message
    assert [p.name for p in runs.iterdir() if not p.name.startswith(".")] == [first.name], "bad input made a run"
    assert list(usercheck.cache_dir(runs).glob("*.json")) == entries, "a failed check was remembered"

