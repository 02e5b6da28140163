"""Names and paths that reach a shell, a batch script, preset.toml or the terminal (issue #34 items 4, 5):
refused at launch when they hold a control character (exit 2, one line, nothing made), quoted
everywhere else, and never obeyed by the terminal."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from mt.contract.paths import RunPaths
from tests.cli.conftest import mt, run_dir_from, write_preset
from tests.tui.synth import write_status
from tui.supervise.launch import Overrides, create_run

ESC = "\x1b[2J"


def _one_line(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), done.stderr
    assert "Traceback" not in done.stderr and "\x1b" not in done.stdout + done.stderr
    return lines[0]


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x1b[2Jb", "a\x7fb"])
def test_a_runs_dir_with_a_control_character_is_refused_from_the_preset_and_the_flag(tmp_path: Path, bad: str) -> None:
    runs = tmp_path / bad
    preset = write_preset(tmp_path / "p.toml", runs)
    _one_line(mt("launch", preset, "--detach"), str(preset), "run.runs_dir", "not allowed in a name or path")
    _one_line(mt("launch", write_preset(tmp_path / "q.toml", tmp_path / "ok"), "--detach", "--runs-dir", runs),
              "--runs-dir", "run.runs_dir", json.dumps(str(runs)))
    _one_line(mt("launch", preset, "--slurm", "--dry-run"), "run.runs_dir")   # nothing reaches job.sh either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml", "q.toml"], "something was created"


def test_a_script_path_workdir_or_name_with_a_newline_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "tr\nain.py"
    script.write_text("print('never run')\n")
    _one_line(mt("launch", script, "--detach", "--runs-dir", tmp_path / "runs"), "PRESET", "a newline (\\n)")
    odd = tmp_path / "w\nd"
    odd.mkdir()
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", run={"workdir": str(odd)})
    _one_line(mt("launch", preset, "--detach"), "run.workdir", "a newline")
    preset = write_preset(tmp_path / "s.toml", tmp_path / "runs", launch={"script": str(script)})
    _one_line(mt("launch", preset, "--detach"), "launch.script", "a newline")
    _one_line(mt("launch", write_preset(tmp_path / "n.toml", tmp_path / "runs"), "--detach", "--name", "a\nb"), '--name "a\\nb": run.name', "a newline")
    assert not (tmp_path / "runs").exists()


def _sbatch_args(line: str) -> list[str]:
    """The arguments sbatch takes from an #SBATCH line, as Slurm's get_argument (src/sbatch/opt.c) splits
    them: whitespace ends an argument outside quotes (even after a backslash: the loop tests it first),
    a backslash keeps the next character as it is, quotes group, a bare `#` ends the line."""
    args, cur, quote, esc, started, i, text = [], "", "", False, False, 0, line.removeprefix("#SBATCH")
    while i < len(text):
        ch = text[i]
        if not quote and ch.isspace():
            if started:
                args.append(cur)
            cur, started, esc = "", False, False
        elif esc:
            cur, esc = cur + ch, False
        elif ch == "\\":
            esc, started = True, True
        elif quote:
            if ch == quote:
                quote = ""
            else:
                cur += ch
        elif ch in "\"'":
            quote, started = ch, True
        elif ch == "#":
            break
        else:
            cur, started = cur + ch, True
        i += 1
    return args + [cur] if started else args


def test_the_batch_script_of_a_run_dir_with_spaces_quotes_and_dollars_keeps_it_exactly(tmp_path: Path) -> None:
    """--dry-run's job.sh: bash parses it, the `# mt run` word and the supervisor's --run-dir come back
    (through bash itself) as the very path, and #SBATCH --output names it as sbatch will split it."""
    runs = tmp_path / "my runs 'q' \"dq\" $HOME `id` #x %j ;&|"
    done = mt("launch", write_preset(tmp_path / "p.toml", runs), "--slurm", "--dry-run")
    assert done.returncode == 0, done.stderr
    script = done.stdout
    (tmp_path / "job.sh").write_text(script)
    syntax = subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    word = re.search(r"^# mt run (.*) \(mt launch --slurm\)", script, re.M)[1]
    back = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True)
    run_dir = Path(back.stdout)
    assert run_dir.parent == runs.resolve() and run_dir.name.startswith("t-"), back.stdout
    # the srun line with srun as a function that prints what it was given, and that command run by bash
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    given = subprocess.run(["bash", "-c", "srun() { printf '%s\\0' \"$@\"; }; " + srun.removesuffix(" &")],
                           capture_output=True, text=True).stdout.split("\0")[:-1]
    assert given[-3:-1] == ["bash", "-c"], given
    argv = subprocess.run(["bash", "-c", "exec() { printf '%s\\0' \"$@\"; }; " + given[-1]],
                          capture_output=True, text=True).stdout.split("\0")[:-1]
    assert argv[argv.index("--run-dir") + 1] == str(run_dir), argv
    out = next(line for line in script.splitlines() if line.startswith("#SBATCH --output="))
    assert _sbatch_args(out) == [f"--output={str(run_dir).replace('%', '%%')}/slurm/job-%j.out"], out
    assert not runs.exists()


def test_a_run_dir_that_resolves_to_a_control_character_is_refused_for_slurm(tmp_path: Path) -> None:
    """`runs` is a link to a folder whose name holds ESC: the preset is fine, the run directory is not;
    --dry-run and a real submission both say so in one escaped line, and leave nothing."""
    target = tmp_path / f"odd{ESC}"
    target.mkdir()
    (tmp_path / "runs").symlink_to(target)
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs")
    _one_line(mt("launch", preset, "--slurm", "--dry-run"), "an escape character", "cannot go there")
    if shutil.which("sbatch"):
        _one_line(mt("launch", preset, "--slurm"), "an escape character")
    assert list(target.iterdir()) == []


def test_a_pending_line_never_reaches_the_terminal_raw(tmp_path: Path) -> None:
    """Slurm's reason for a queued job (squeue %r: text an admin may set) reaches `mt watch --once` escaped."""
    run_dir = create_run(write_preset(tmp_path / "p.toml", tmp_path / "runs"), Overrides())
    write_status(RunPaths(run_dir), {"state": "pending", "attempt": 0, "slurm_job_id": "1234", "reason": "submitted"})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"   # this squeue answers what a cluster's could: job 1234, held, a reason with ESC
    squeue.write_text("#!/bin/sh\nprintf '1234,PENDING,held \\033[2J by admin\\n'\n")
    squeue.chmod(0o755)
    done = mt("watch", run_dir, "--once", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "pending: Slurm job 1234 PENDING (held \\x1b[2J by admin)" in done.stdout, done.stdout


def test_the_preset_toml_of_a_script_run_round_trips_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    args = ["line\nbreak", 'say "hi"', "back\\slash", "del\x7f", "nul\x00", "esc\x1b[2J", "tab\t", "crlf\r\n",
            "[model]", "emoji 😀", "é", "'single'", "\\u0041", ""]
    run_dir = create_run(script, Overrides(runs_dir=str(tmp_path / "runs"), script_args=args))
    got = tomllib.loads(RunPaths(run_dir).preset.read_text(encoding="utf-8"))
    assert got["launch"]["script_args"] == args
    assert got["launch"]["script"] == str(script) and set(got) == {"run", "launch"}


@pytest.mark.parametrize("pid", ["-1", "0", "2147483647"])
def test_stacks_of_a_pid_that_is_no_process(pid: str) -> None:
    _one_line(mt("stacks", "--pid", pid), f"pid {pid}" if pid.isdigit() and pid != "0" else f"got {pid}")


@pytest.mark.slow
def test_a_scripts_arguments_reach_it_exactly_and_its_preset_toml_launches_it_again(tmp_path: Path) -> None:
    """ARGS with a newline, quotes, `;`, `$HOME`, backquotes, ESC, DEL and an emoji: the script's argv holds them as
    given (an argv list, no shell), and the generated preset.toml, launched itself, gives the same."""
    script = tmp_path / "argv_dump.py"
    script.write_text("import json, sys\nfrom pathlib import Path\n"
                      "Path(__file__).with_name('argv.json').write_text(json.dumps(sys.argv[1:]))\n")
    args = ["line\nbreak", 'say "hi"; rm -rf x', "$HOME `id`", ESC, "back\\slash", "del\x7f", "emoji 😀", "--lr", "3"]
    done = mt("launch", script, "--headless", "--nproc", "1", "--runs-dir", tmp_path / "runs", "--", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "argv.json").read_text()) == args
    (tmp_path / "argv.json").unlink()
    again = mt("launch", RunPaths(run_dir_from(done.stdout)).preset, "--headless", "--nproc", "1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((tmp_path / "argv.json").read_text()) == args
