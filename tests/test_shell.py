"""Every value that reaches a shell is quoted (issue #34: a runs_dir with a newline put a command into
RUN/slurm/job.sh): no code runs a command through a shell, and the one shell script mt writes, the
Slurm batch script, interpolates nothing but `shlex.quote`/`shlex.join` outside its #SBATCH lines
(which sbatch parses itself; their values are validated: tests/cli/test_shell_input.py)."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.test_door import _dotted

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mt", "tui", "engine", "bench")
SHELL_CALLS = {"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"}
QUOTED = {"shlex.quote", "shlex.join"}
SCRIPT = ("tui/cluster/slurm.py", "batch_script")   # the shell script mt writes


def through_a_shell(source: str) -> list[int]:
    """Lines that run a command through a shell: shell=True, os.system, os.popen, getoutput."""
    return [n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and (
        _dotted(n.func) in SHELL_CALLS
        or any(k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False) for k in n.keywords))]


def unquoted_in_script(source: str, function: str) -> list[str]:
    """Each value `function` formats into a script line (not an #SBATCH line) other than through shlex."""
    fn = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == function)
    # `opts` holds the #SBATCH options: what is built into it goes on an #SBATCH line
    sbatch = {id(s) for n in ast.walk(fn)
              if (isinstance(n, ast.Assign) and any(_dotted(t) == "opts" for t in n.targets))
              or (isinstance(n, ast.Call) and _dotted(n.func) == "opts.append")
              for s in ast.walk(n) if isinstance(s, ast.JoinedStr)}
    bad = []
    for s in (n for n in ast.walk(fn) if isinstance(n, ast.JoinedStr) and id(n) not in sbatch):
        head = s.values[0].value if s.values and isinstance(s.values[0], ast.Constant) else ""
        if isinstance(head, str) and head.startswith("#SBATCH "):
            continue
        bad += [ast.unparse(v.value) for v in s.values
                if isinstance(v, ast.FormattedValue) and not (isinstance(v.value, ast.Call) and _dotted(v.value.func) in QUOTED)]
    return bad


def test_no_command_runs_through_a_shell() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}" for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
             for line in through_a_shell(p.read_text(encoding="utf-8"))]
    assert not found, "a command through a shell (use an argv list):\n" + "\n".join(found)


def test_the_batch_script_quotes_every_value_it_writes() -> None:
    module, function = SCRIPT
    assert unquoted_in_script((ROOT / module).read_text(encoding="utf-8"), function) == []


def test_the_walkers_find_what_they_forbid() -> None:
    assert through_a_shell("import subprocess, os\nsubprocess.run(cmd, shell=True)\nos.system('ls')\n") == [2, 3]
    assert through_a_shell("subprocess.run(['ls'], shell=False)\n") == []
    snippet = ('def batch_script(d):\n    opts = [f"--x={d}"]\n    opts.append(f"--y={d}")\n'
               '    return [f"#SBATCH --x={d}", f"cd {shlex.quote(d)}", f"cd {d}", f"echo {str(d)}"]\n')
    assert unquoted_in_script(snippet, "batch_script") == ["d", "str(d)"]
