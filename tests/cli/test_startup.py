"""The CLI never imports torch, `mt --help` is quick, and every command explains itself."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.cli.conftest import REPO, mt, write_preset
from tui.cli import app
from tui.supervise.launch import Overrides, create_run

# Runs `mt ARGS` in-process, then reports whether torch was imported along the way.
PROBE = (
    "import sys\n"
    "sys.argv = ['mt', *sys.argv[1:]]\n"
    "import tui.cli\n"
    "try:\n"
    "    tui.cli.main()\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "else:\n"
    "    code = 0\n"
    "print('TORCH_LOADED' if 'torch' in sys.modules else 'TORCH_FREE', code, file=sys.stderr)\n"
)


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True,
                          text=True, timeout=60, cwd=REPO)


def test_importing_the_cli_loads_no_torch() -> None:
    res = subprocess.run([sys.executable, "-c", "import sys, tui.cli, tui.supervise.launch, tui.supervise.control, tui.supervise.supervisor, "
                          "tui.supervise.sampler, tui.supervise.procs, tui.report.headless, tui.report.runs, tui.tools.doctor; "
                          "assert 'torch' not in sys.modules, 'torch imported'"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0, res.stderr


def test_help_ls_and_watch_once_load_no_torch(tmp_path: Path) -> None:
    run_dir = create_run(write_preset(tmp_path / "p.toml", tmp_path / "runs"), Overrides())
    for args in (["--help"], ["ls", tmp_path / "runs"], ["watch", run_dir, "--once"]):
        res = _probe(*args)
        assert "TORCH_FREE 0" in res.stderr, (args, res.stdout, res.stderr)
    assert run_dir.name in _probe("ls", tmp_path / "runs").stdout


def test_help_is_quick() -> None:
    # bench/cli_startup.py reports the real number (target 0.25 s); other suites run
    # concurrently here, so this only catches a gross regression such as importing torch
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        res = mt("--help")
        times.append(time.perf_counter() - t0)
        assert res.returncode == 0
    assert min(times) < 1.5, times


@pytest.mark.parametrize("command", ["launch", "watch", "resume", "ls", "diff", "ckpt", "stop", "kill", "doctor"])
def test_every_command_has_help_with_an_example(command: str) -> None:
    res = CliRunner().invoke(app, [command, "--help"])
    assert res.exit_code == 0
    assert "Example:" in res.stdout and f"mt {command}" in res.stdout


def test_no_arguments_shows_help() -> None:
    res = CliRunner().invoke(app, [])
    assert "launch" in res.output and "Usage" in res.output


def test_unknown_option_is_bad_input() -> None:
    res = CliRunner().invoke(app, ["launch", "x.toml", "--frobnicate"])
    assert res.exit_code == 2
