"""A straggler's verdict and each rank's step anatomy: printed by --once and --headless, headed in the
incident panel, and under each rank's row in the system panel."""
from __future__ import annotations

import time
from pathlib import Path

from tests.tui.synth import complete, finished_run, running_run
from tests.tui.test_headless_text import append, headless, incident
from tui.format.fmt import anatomy_lines
from tui.read.follower import load_run_state
from tui.read.watcher import SystemView, Watcher
from tui.report.summary import format_summary
from tui.widgets.incidents import incident_detail
from tui.widgets.system import render_system

WHY = "rank 1 is input-bound: it waits 83 ms a step for data while rank 0 waits ~86 ms in all-reduce for it"
EVIDENCE = {"why": WHY, "rank": 1, "bound": "input", "gap_s": 0.08,
            "anatomy": {"0": {"step_s": 0.0904, "data_s": 0.00078, "work_s": 0.0037, "comm_s": 0.0855},
                        "1": {"step_s": 0.0905, "data_s": 0.0835, "work_s": 0.0042, "comm_s": 0.0024}}}
LINES = [WHY, "rank 0: step 90 ms: data 0.78 ms, compute 3.7 ms, wait 86 ms",
         "rank 1: step 90 ms: data 84 ms, compute 4.2 ms, wait 2.4 ms"]


def test_the_lines_and_what_a_file_may_hold_instead() -> None:
    assert anatomy_lines(EVIDENCE) == LINES
    assert anatomy_lines({"why": 3, "anatomy": {}}) == [] and anatomy_lines({"why": WHY, "anatomy": [1]}) == []
    odd = anatomy_lines({"why": WHY, "anatomy": {"1": {"step_s": "x", "data_s": True}, "0": 5}})
    assert odd == [WHY, "rank 1: step N/A"]


def test_once_and_the_incident_panel_show_them(tmp_path: Path) -> None:
    r = finished_run(tmp_path, steps=10)
    r.paths.incidents.write_text(incident(r.t, "straggler", 6, evidence=EVIDENCE, severity="warn"))
    st = load_run_state(tmp_path)
    lines = format_summary(st, now=r.t).splitlines()
    at = lines.index("  open   [warn] straggler at step 6: straggler title")
    assert lines[at + 1:at + 4] == [f"         {line}" for line in LINES]
    detail = str(incident_detail(st.incidents[0])).splitlines()
    assert detail[1:4] == [WHY, f"  {LINES[1]}", f"  {LINES[2]}"]
    assert not any(line.startswith("  anatomy:") for line in detail) and "  bound: input" in detail


def test_headless_prints_them_under_the_incident_once(tmp_path: Path) -> None:
    r = running_run(tmp_path)
    with headless(tmp_path) as (out, result):
        append(r.paths.incidents, incident(r.t + 1, "straggler", 5, evidence=EVIDENCE, severity="warn"))
        time.sleep(0.3)
        complete(r, 5)
    assert result == ["completed"]
    lines = out.getvalue().splitlines()
    at = lines.index("incident [warn] straggler at step 5: straggler title")
    assert lines[at + 1:at + 4] == [f"  {line}" for line in LINES], lines
    assert sum(WHY in line for line in lines) == 1


def test_the_system_panel_shows_each_ranks_step_under_its_row(tmp_path: Path) -> None:
    r = finished_run(tmp_path, steps=3)
    r.paths.heartbeat_dir.mkdir(exist_ok=True)
    r.paths.heartbeat(1).write_text('{"step":3,"t":1.8e9,"rank":1,"attempt":1,"phase":"train","anatomy":'
                                    '{"n":20,"step_s":0.0905,"data_s":0.0835,"compute_s":0.0032,"optim_s":0.0009,"comm_s":0.0024}}')
    r.paths.heartbeat(0).write_text("not json")  # a rank without one: its row alone
    append(r.paths.system, '{"v":1,"t":1.8e9,"gpus":[],"host":{"cpu_pct":50},"ranks":[{"rank":0,"pid":1,"cpu_pct":99,'
                           '"alive":true},{"rank":1,"pid":2,"cpu_pct":40,"alive":true}]}\n')
    w = Watcher(tmp_path)
    w.poll()
    assert set(w.system.anatomy) == {1}
    text = str(render_system(w.system)).splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("rank1 "))
    assert text[at + 1] == "  90 ms: data 84, compute 3.2, optim 0.9, wait 2.4"
    assert text[at - 1].startswith("rank0 ") and not render_system(SystemView()).plain.count("ms:")
