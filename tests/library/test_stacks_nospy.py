"""Without py-spy (an interpreter with no py-spy beside it, a PATH without one): the faulthandler path
still gives the verdict for mt's engine and a library script, and what py-spy would add is said."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, events, status, wait_for, write_preset
from tests.cli.test_incident_stacks import _update
from tests.engine.runner import kill_tree
from tests.engine.usercode import work_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SCRIPT = REPO / "tests" / "library" / "scripts" / "faulty.py"
LINES = SCRIPT.read_text().splitlines()
HANG_LINE = next(i for i, line in enumerate(LINES, 1) if "time.sleep(1.0)" in line)
REDUCE_LINE = next(i for i, line in enumerate(LINES, 1) if "dist.all_reduce(t)" in line)


def _no_spy_python(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A venv seeing this one's packages but with no py-spy binary beside its python, and a PATH without one."""
    venv = tmp_path / "nospy"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # addsitedir, not a bare path: the .pth files of this venv's own site folders still count
    dirs = [p for p in sys.path if p.endswith("site-packages")] + [sysconfig.get_paths()["purelib"], str(REPO)]
    (site / "mt_test.pth").write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in dict.fromkeys(dirs)))
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if d and not shutil.which("py-spy", path=d))
    python = str(venv / "bin" / "python")
    env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}
    probe = subprocess.run([python, "-c", "from tui.stacks.capture import py_spy; print(py_spy())"],
                           capture_output=True, text=True, env=env, cwd=REPO)
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr   # the premise: no py-spy anywhere
    return python, env


def _mt(python: str, env: dict[str, str], *args: object, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "tui.cli", *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=240)


def _end(run_dir: Path) -> None:
    st = status(run_dir)
    for pid in (st.get("supervisor_pid"), st.get("torchrun_pid")):
        if isinstance(pid, int):
            kill_tree(pid)


def test_without_py_spy_the_signal_path_gives_the_verdict_and_says_what_py_spy_would_add(tmp_path):
    python, env = _no_spy_python(tmp_path)

    # mt's engine: a DataLoader stall's incident names the ranks by faulthandler, and says py-spy reads the workers
    preset = write_preset(
        tmp_path / "p.toml", tmp_path / "runs", run={"workdir": str(work_folder(tmp_path))},
        launch={"nproc_per_node": 2, "device": "cpu"}, train={"max_steps": 400, "eval_every": 0},
        checkpoint={"every_steps": 0}, monitor={"hang_floor_s": 120.0},
        model={"kind": "python", "factory": "my_models:build", "args": {"vocab": 32, "hidden": 32, "dropout": 0.1}},
        data={"source": "python", "factory": "my_data:stuck", "args": {"rank": 1, "at": 30}, "num_workers": 1})
    res = _mt(python, env, "launch", preset, "--detach", "--name", "nospy")
    assert res.returncode == 0, res.stdout + res.stderr
    runs = [engine_run := Path(res.stdout.strip())]
    try:
        # a library script: its own dump on SIGUSR2; one that calls nothing from mt: what py-spy would
        # add (launched now: their start-ups overlap the engine run's wait for its stall)
        for flags, name in (((), "lib"), (("--no-mt",), "bare")):
            res = _mt(python, env, "launch", SCRIPT, "--nproc", "2", "--runs-dir", tmp_path / "runs", "--name", name,
                      "--detach", "--", "--fault", "hang", "--rank", "1", "--at", "3", "--steps", "400", *flags, cwd=tmp_path)
            assert res.returncode == 0, res.stderr
            runs.append(Path(res.stdout.strip().splitlines()[-1]))
        lib, bare = runs[1:]

        # mt's engine: a DataLoader stall's incident names the ranks by faulthandler, and says py-spy reads the workers
        wait_for(lambda: events(engine_run, "step"), 240, "the first step")
        _, upd = _update(engine_run, "dataloader_stall", 180)
        ev = upd["evidence"]
        assert "no stack from" not in ev["verdict"] and sum(len(g["ranks"]) for g in ev["groups"]) == 2, ev
        assert all(w.endswith("no stack (py-spy reads DataLoader workers (they are never signalled): "
                              "pip install 'mt[stacks]')") for w in ev["workers"]) and ev["workers"], ev
        assert ev["workers"][0] in upd["detail"]
        _end(engine_run)

        want = (f"rank 1 is in `<module>` (faulty.py:{HANG_LINE}); "
                f"rank 0 waits in `all_reduce` (faulty.py:{REDUCE_LINE})")
        got = wait_for(lambda: (o := _mt(python, env, "stacks", lib)).returncode == 0
                       and o.stdout.splitlines()[0] == want and o.stdout, 120, "rank 1 in its hang", every=1.0)
        assert "[faulthandler]" in got.splitlines()[1], got
        _end(lib)

        got = wait_for(lambda: (o := _mt(python, env, "stacks", bare)).returncode == 0 and o.stdout, 120,
                       "the bare script's ranks", every=1.0)
        lines = got.splitlines()
        assert lines[0] == "no stack from ranks 0, 1", got
        assert all(line.endswith("no SIGUSR2 handler (no mt in the script); py-spy would read it without "
                                 "a signal handler: pip install 'mt[stacks]'") for line in lines[1:3]), got
    finally:
        for run_dir in runs:
            _end(run_dir)
