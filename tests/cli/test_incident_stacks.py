"""The supervisor captures every rank's stacks when a hang or a DataLoader stall opens, and the
incident gains the verdict (real `mt launch`, real ranks, real signals and py-spy)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import end_run, events, launch_user_run, mt, wait_for
from tui.stacks.capture import py_spy

pytestmark = pytest.mark.slow


def _incidents(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in (run_dir / "incidents.jsonl").read_text().splitlines() if line.strip()]
    except OSError:
        return []


def _update(run_dir: Path, code: str, timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the open record, the update with the stacks) of the first incident `code`."""
    def found() -> tuple[dict[str, Any], dict[str, Any]] | None:
        recs = [r for r in _incidents(run_dir) if r.get("code") == code]
        opened = next((r for r in recs if r["status"] == "open"), None)
        upd = next((r for r in recs if r["status"] == "update"), None)
        return (opened, upd) if opened and upd else None
    return wait_for(found, timeout, f"the {code} incident's stacks")


def test_the_hang_incident_names_the_stuck_rank_and_the_collective_the_others_wait_in(tmp_path: Path) -> None:
    floor = 4.0
    run_dir = launch_user_run(tmp_path, 4, {"factory": "my_data:stuck", "args": {"rank": 2, "at": 20}, "num_workers": 0},
                      {"hang_floor_s": floor, "hang_step_factor": 2.0})
    try:
        wait_for(lambda: events(run_dir, "step"), 240, "the first step")
        opened, upd = _update(run_dir, "hang", 180)
        last_step_t = max(e["t"] for e in events(run_dir, "step"))
        ev = upd["evidence"]
        odd, rest = ev["groups"][0], ev["groups"][1]
        assert odd["ranks"] == [2] and odd["func"] == "slow_item" and odd["where"].startswith("my_data.py:"), ev
        assert rest["ranks"] == [0, 1, 3] and rest["waits_in"], ev   # the collective the others sit in
        assert ev["verdict"].startswith(f"rank 2 is in `slow_item` ({odd['where']}); ranks 0, 1, 3 wait in "
                                        f"`{rest['waits_in']}`"), ev
        assert ev["verdict"] in upd["detail"] and upd["detail"].startswith(opened["detail"])
        assert (run_dir / ev["stacks"] / "verdict.json").is_file() and ev["stacks"].startswith("stacks/")
        assert ev["stacks"].endswith("Z-hang") and upd["step"] == opened["step"] and upd["title"] == opened["title"]
        # the bound: the verdict within the hang rule's time (+ its start-up factor) + 5 s
        assert upd["t"] - opened["t"] <= 5.0, (opened["t"], upd["t"])
        print(f"\nhang open -> verdict update: {upd['t'] - opened['t']:.2f} s "
              f"(last step -> open {opened['t'] - last_step_t:.1f} s, capture {ev['capture_s']} s)")
        once = mt("watch", run_dir, "--once")
        assert once.returncode == 0, once.stderr
        lines = once.stdout.splitlines()
        at = next(i for i, line in enumerate(lines) if " hang " in line and "[error]" in line)
        assert lines[at + 1].strip() == f"stacks: {ev['verdict']}", once.stdout
    finally:
        end_run(run_dir)


@pytest.mark.skipif(py_spy() is None, reason="py-spy reads DataLoader workers")
def test_the_stall_incident_names_the_dataloader_workers_frame(tmp_path: Path) -> None:
    run_dir = launch_user_run(tmp_path, 2, {"factory": "my_data:stuck", "args": {"rank": 1, "at": 60}, "num_workers": 1},
                      {"hang_floor_s": 120.0})
    try:
        wait_for(lambda: events(run_dir, "step"), 240, "the first step")
        opened, upd = _update(run_dir, "dataloader_stall", 180)
        ev = upd["evidence"]
        stuck = [w for w in ev["workers"] if w.startswith("rank 1's DataLoader worker ")]
        assert stuck and "is in `slow_item` (my_data.py:" in stuck[0] and "__getitem__` (my_data.py:" in stuck[0], ev
        assert stuck[0] in upd["detail"] and ev["stacks"].endswith("Z-dataloader_stall")
        kept = json.loads((run_dir / ev["stacks"] / "verdict.json").read_text())
        worker = next(w for w in kept["workers"] if w["rank"] == 1)
        assert worker["func"] == "slow_item" and (run_dir / ev["stacks"] / f"rank1-worker{worker['pid']}.txt").is_file()
    finally:
        end_run(run_dir)
