"""README.md for people: its first screen shows the dashboard and gives the two commands that
scripts/ and .ci/run really use; every link it (and the docs' index and map) makes resolves."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _first_screen() -> str:
    """The README up to its first section after "On a new machine"."""
    text = README.read_text()
    return text[: text.index("\n## ", text.index("## On a new machine") + 1)]


def _commands(md: str) -> list[str]:
    """The command lines of every ```sh block."""
    return [line.strip() for block in re.findall(r"```sh\n(.*?)```", md, re.S)
            for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _script_commands(path: Path) -> list[list[str]]:
    """A shell script's command lines as words, comments and `set` left out."""
    out = []
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] not in ("set", "if", "fi", "then", "else", "command"):
            out.append(words)
    return out


def test_the_first_screen_gives_the_two_commands_scripts_and_ci_use() -> None:
    demo, test = _commands(_first_screen())
    assert (demo, test) == ("bash scripts/demo.sh", "bash scripts/test.sh")
    # the main job: the demo script launches the preset the README names, on 2 CPU processes
    launch = _script_commands(ROOT / "scripts" / "demo.sh")[-1]
    assert launch[:4] == ["exec", ".venv/bin/mt", "launch", "presets/tiny-cpu.toml"], launch
    assert "`presets/tiny-cpu.toml`" in _first_screen()
    preset = (ROOT / "presets" / "tiny-cpu.toml").read_text()
    assert re.search(r"^nproc_per_node = 2$", preset, re.M) and re.search(r'^device = "cpu"$', preset, re.M)
    # CI runs exactly the README's test command, last
    assert _script_commands(ROOT / ".ci" / "run")[-1] == shlex.split(test)


def test_the_first_screen_shows_the_dashboard_made_by_the_script() -> None:
    images = [t for t in LINK.findall(_first_screen()) if t.endswith(".svg")]
    assert images == ["docs/dashboard.svg"], images
    svg = (ROOT / images[0]).read_text().replace("&#160;", " ")   # Rich writes spaces as &#160;
    assert svg.lstrip().startswith("<svg") and "1 plots" in svg and "2 system" in svg   # the dashboard's panels
    assert "docs/dashboard.svg" in (ROOT / "scripts" / "screenshot.py").read_text()


def test_docs_map_is_the_one_folder_map() -> None:
    for page in (README, ROOT / "docs" / "README.md"):
        text = page.read_text()
        assert not re.search(r"^\| *(folder|Path) *\|", text, re.M | re.I), f"{page.name} has a folder table of its own"
        assert "map.md" in text, f"{page.name} does not link the map"


def test_every_docs_link_resolves_to_a_file() -> None:
    pages = [README, ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue   # a web address, or a heading of the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.is_file():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


@pytest.mark.slow
def test_the_screenshot_script_shoots_a_real_run_and_leaves_nothing_running(tmp_path: Path) -> None:
    out = tmp_path / "dashboard.svg"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "screenshot.py"), "--out", str(out), "--steps", "10"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = done.stdout.splitlines()[0].strip()
    svg = out.read_text().replace("&#160;", " ")
    assert "tiny-cpu" in svg and "1 plots" in svg and "4 logs" in svg
    assert not Path(run_dir).exists()   # the run lived in a temporary folder, gone now
    left = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"]) if run_dir in " ".join(p.info["cmdline"] or [])]
    assert not left, f"processes of the shot's run still running: {left}"
