"""An incident's captured stacks (an `update` line of incidents.jsonl): parsed, merged into the one
incident, printed under it by --once and --headless, headed in the dashboard's detail."""
from __future__ import annotations

import time
from pathlib import Path

from mt.contract.events import SCHEMA, dumps, schema_errors
from mt.contract.incident import IncidentLine
from mt.contract.records import parse_incident
from tests.tui.synth import complete, finished_run, running_run
from tests.tui.test_headless_text import append, headless, incident
from tui.read.follower import load_run_state
from tui.report.summary import format_summary
from tui.widgets.incidents import incident_detail

VERDICT = "rank 2 is in `slow_item` (my_data.py:57); ranks 0, 1, 3 wait in `backward` (engine/train.py:194)"
STACKS = {"stacks": "stacks/20261202T071500Z-hang", "verdict": VERDICT,
          "groups": [{"ranks": [2], "func": "slow_item", "where": "my_data.py:57", "waits_in": None},
                     {"ranks": [0, 1, 3], "func": "_step", "where": "engine/train.py:194", "waits_in": "backward"}],
          "frames": ["rank 2: slow_item (my_data.py:57)", "__getitem__ (my_data.py:51)"], "capture_s": 0.1}


def update(t: float, evidence: dict) -> str:
    return dumps(dict(v=1, t=t, status="update", source="supervisor", code="hang", severity="error", step=6,
                      title="hang title", detail=f"no step for 30 s; stacks: {VERDICT}", advice="",
                      evidence={"idle_s": 30.0, **evidence})) + "\n"


def test_an_update_line_is_a_valid_incident_record() -> None:
    rec = parse_incident(update(1.8e9, STACKS))
    assert isinstance(rec, IncidentLine) and rec.status == "update" and rec.evidence["verdict"] == VERDICT
    assert "update" in next(f.choices for f in SCHEMA["incident"] if f.name == "status")
    assert schema_errors({**rec.raw, "kind": "incident"}) == []
    bad = parse_incident(update(1.8e9, STACKS).replace('"update"', '"reopened"'))
    assert not isinstance(bad, IncidentLine) and "open, update, closed" in bad.reason


def test_once_prints_the_verdict_under_the_one_incident(tmp_path: Path) -> None:
    r = finished_run(tmp_path, steps=10)
    r.paths.incidents.write_text(incident(r.t, "hang", 6) + update(r.t + 1, STACKS))
    st = load_run_state(tmp_path)
    assert [(i.code, i.status) for i in st.incidents] == [("hang", "open")]   # merged, not a second one
    lines = format_summary(st, now=r.t).splitlines()
    at = lines.index("  open   [error] hang at step 6: hang title")
    assert lines[at + 1] == f"         stacks: {VERDICT}"


def test_a_verdict_of_the_wrong_type_prints_nothing_and_crashes_nothing(tmp_path: Path) -> None:
    r = finished_run(tmp_path, steps=10)
    r.paths.incidents.write_text(incident(r.t, "hang", 6) + update(r.t + 1, {"verdict": 7, "workers": "x", "frames": 3}))
    st = load_run_state(tmp_path)
    assert "stacks:" not in format_summary(st, now=r.t)
    lines = str(incident_detail(st.incidents[0])).splitlines()
    assert not lines[1].startswith("stacks:") and "  verdict: 7" in lines   # shown as it is, raw


def test_headless_prints_the_verdict_once_when_the_update_comes(tmp_path: Path) -> None:
    r = running_run(tmp_path)
    with headless(tmp_path) as (out, result):
        append(r.paths.incidents, incident(r.t + 1, "hang", 6))
        time.sleep(0.3)
        assert "stacks:" not in out.getvalue()
        append(r.paths.incidents, update(r.t + 2, {**STACKS, "workers": ["rank 2's DataLoader worker 9 is in `x` (d.py:1)"]}))
        time.sleep(0.3)
        append(r.paths.incidents, incident(r.t + 3, "hang", 6, status="closed"))
        complete(r, 5)
    assert result == ["completed"]
    lines = out.getvalue().splitlines()
    at = lines.index("incident [error] hang at step 6: hang title")
    assert lines[at + 1:at + 3] == [f"  stacks: {VERDICT}", "  rank 2's DataLoader worker 9 is in `x` (d.py:1)"], lines
    assert sum("stacks:" in line for line in lines) == 1 and "incident closed: hang at step 6: hang title" in lines


def test_the_incident_detail_heads_with_the_verdict_and_the_odd_ranks_frames(tmp_path: Path) -> None:
    r = finished_run(tmp_path, steps=10)
    r.paths.incidents.write_text(incident(r.t, "hang", 6) + update(r.t + 1, STACKS))
    lines = str(incident_detail(load_run_state(tmp_path).incidents[0])).splitlines()
    assert lines[1:4] == [f"stacks: {VERDICT}", "  rank 2: slow_item (my_data.py:57)", "  __getitem__ (my_data.py:51)"]
    assert "  stacks: stacks/20261202T071500Z-hang" in lines and "  idle_s: 30" in lines
    assert not any(line.startswith(("  groups:", "  frames:", "  verdict:")) for line in lines)
