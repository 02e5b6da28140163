"""`mt stacks`: every rank's stack from real engine ranks, the verdict naming the rank the others wait for."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tui.stacks.capture import capture
from tui.stacks.verdict import parse_faulthandler

from .runner import REPO, events, kill_tree, logs, make_run, start, wait_for
from .usercode import user_base

pytestmark = pytest.mark.slow


def _steps_stopped(run, quiet_s: float = 2.0) -> int:
    """The step count once it has not grown for quiet_s (every rank now waits where it stopped)."""
    wait_for(lambda: len(events(run, "step")) >= 1, 180, "a first step")
    seen, since = -1, time.monotonic()
    while time.monotonic() - since < quiet_s:
        n = len(events(run, "step"))
        if n != seen:
            seen, since = n, time.monotonic()
        time.sleep(0.1)
    return seen


def test_four_ranks_name_the_one_stuck_in_user_code_and_the_collective_the_others_wait_in(tmp_path):
    base = user_base(tmp_path)
    run = make_run(tmp_path, base=base, data={"factory": "my_data:stuck", "args": {"rank": 2, "at": 20}},
                   train={"max_steps": 400})
    proc = start(run, nproc=4)
    try:
        _steps_stopped(run)
        cap = capture(run)
        odd, rest = cap.verdict.groups
        assert odd.ranks == (2,) and odd.place.frame.func == "slow_item", (cap.verdict, logs(run))
        assert odd.place.frame.file.endswith("my_data.py") and rest.ranks == (0, 1, 3)
        assert rest.place.waits_in, cap.verdict  # the collective the others sit in
        assert cap.verdict.line.startswith(f"rank 2 is in `slow_item` (my_data.py:{odd.place.frame.line}); "
                                           f"ranks 0, 1, 3 wait in `{rest.place.waits_in}` (")
        assert all(s.source == "faulthandler" for s in cap.stacks)
        kept = json.loads((cap.folder / "verdict.json").read_text())
        assert cap.folder.parent == run / "stacks" and cap.folder.name.endswith("Z-request")
        assert kept["line"] == cap.verdict.line and kept["groups"][0]["ranks"] == [2]
        assert kept["ranks"]["2"]["source"] == "faulthandler" and kept["ranks"]["2"]["place"]["func"] == "slow_item"
        # the kept raw dump parses back to the same place (the parser on a real process's dump)
        main = next(t for t in parse_faulthandler((cap.folder / "rank2.txt").read_text()) if t.main)
        assert main.frames[0].func == "slow_item" and main.frames[-1].func == "_run_module_as_main"
        assert sorted(p.name for p in cap.folder.iterdir()) == [*(f"rank{r}.txt" for r in range(4)), "verdict.json"]
        # the command prints the same verdict first, and every rank's stack with --all
        out = subprocess.run([sys.executable, "-m", "tui.cli", "stacks", str(run), "--all"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == cap.verdict.line and lines[1].startswith("  rank 2: slow_item (")
        assert "[faulthandler]" in lines[1] and sum(line.startswith("rank ") for line in lines[1:]) == 4, out.stdout
        assert len(list((run / "stacks").iterdir())) == 2
    finally:
        kill_tree(proc.pid)


def test_a_healthy_run_gives_one_group_per_place_and_goes_on(tmp_path):
    run = make_run(tmp_path, faults={"step_sleep_s": 0.05}, train={"max_steps": 2000})
    proc = start(run, nproc=2)
    try:
        wait_for(lambda: len(events(run, "step")) >= 3, 180, "3 steps")
        cap = capture(run)
        places = [g.place.key() for g in cap.verdict.groups]
        assert not cap.verdict.missing and len(set(places)) == len(places), cap.verdict
        assert sorted(r for g in cap.verdict.groups for r in g.ranks) == [0, 1]
        assert all(s.source == "faulthandler" and s.main_thread() for s in cap.stacks)
        after = len(events(run, "step"))
        wait_for(lambda: len(events(run, "step")) > after + 3, 60, "steps after the capture")
        assert proc.poll() is None, logs(run)
    finally:
        kill_tree(proc.pid)
