"""One incident type (mt/contract/incident.py): built by rank 0's rules and the supervisor's, read
back by the one parser, kept by the viewer; the bytes runs already hold do not change."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from mt.contract.config import MonitorConfig
from mt.contract.eventlog import EventWriter
from mt.contract.events import dumps
from mt.contract.incident import Incident, IncidentLine
from mt.contract.records import parse_event, parse_incident, read_records
from mt.contract.space import DiskFullError
from mt.rules import StepRules, checkpoint_failed_incident, disk_full_incident, nan_incident, recompile_incident
from tui.diagnose.monitor import IncidentMonitor
from tui.read.follower import load_run_state

from .fakerun import T0, FakeRun
from .streams import steps
from .test_rules_exit import PEER, TRACEBACK, crashed_run

RECORDED = Path(__file__).parent / "recorded"
WHEN = re.compile(rb'"t":[0-9.e+]+')   # when a line was written: the one thing that differs between runs


def rank0_incidents() -> list[Incident]:
    """Every rank-0 rule firing once, on the inputs rank0-events.jsonl was recorded from."""
    found: list[Incident] = []
    s = steps(200, 0)
    base = s[118]["loss"]
    for k in range(119, 124):
        s[k]["loss"] = base * 2.5
    s[169]["grad_norm"] = 50 * s[168]["grad_norm"] + 20
    rules = StepRules(MonitorConfig(), 1.0)
    found += [inc for st in s for inc in rules.observe(st)]
    s = steps(300, 1)
    for st in s:
        st["clipped"] = True
    rules = StepRules(MonitorConfig(), 0.01)
    found += [inc for st in s for inc in rules.observe(st)]
    s = steps(200, 2)
    for st in s:
        st["loss_scale"] = 65536.0
    for k in (100, 103, 106, 109, 112, 115):
        s[k - 1].update(skipped=True, grad_norm=float("inf"))
    rules = StepRules(MonitorConfig(), 1.0)
    found += [inc for st in s for inc in rules.observe(st)]
    found.append(nan_incident(37, 2.5e-3, float("nan"), float("nan"), [4, 91, 1022], "skip"))
    found.append(recompile_incident(2, [("forward", "tensor 'args[0]' size mismatch at index 1. expected 32, actual 16")]))
    full = DiskFullError("no room on /ckpt: 1 MiB free, 9 MiB needed", Path("/ckpt/step_40"), 1 << 20, 9 << 20)
    found.append(disk_full_incident(40, full, "interval", "the newest checkpoint is step_30", "training goes on", 3))
    found.append(checkpoint_failed_incident(50, "OSError: EIO", "the newest checkpoint is step_40", "interval", Path("/ckpt")))
    return found


def write_events(path: Path, incidents: list[Incident]) -> None:
    """As the engine writes them: one `incident` event each through the event writer."""
    w = EventWriter(path, index=False)
    for inc in incidents:
        w.emit("incident", **inc.event_fields())
    w.close()


def filed_run(root: Path) -> FakeRun:
    """An engine incident the monitor copies, a supervisor's opened and closed at once, an update:
    the run recorded in recorded/run/."""
    run = FakeRun(root)
    run.start()
    run.do_step(step_time=0.2)
    run.event("incident", **nan_incident(2, 1e-3, float("nan"), float("nan"), [20], "skip").event_fields())
    run.poll()
    cut = Incident("stop_cut_short", "error", 7, "3 steps lost", "Slurm ended attempt 1", "resume", {"lost": 3})
    run.monitor.note(cut, T0 + 5, "the attempt it concerns had ended")
    run.monitor.update("nan_loss", {"verdict": "x"}, "more", now=T0 + 6)
    return run


def as_json(inc: Incident) -> dict:
    """An incident's fields as a line holds them (non-finite numbers as strings)."""
    return json.loads(dumps(inc.fields()))


def test_every_rule_builds_the_one_incident_and_the_parser_reads_it_back(tmp_path: Path) -> None:
    built = rank0_incidents()
    assert [type(i) for i in built] == [Incident] * 8
    assert [i.code for i in built] == ["loss_spike", "grad_explosion", "clipping_active", "fp16_overflow",
                                       "nan_loss", "recompile", "disk_full", "checkpoint_failed"]
    write_events(tmp_path / "events.jsonl", built)
    back = read_records(tmp_path / "events.jsonl", parse_event)
    assert all(type(r) is IncidentLine and isinstance(r, Incident) for r in back)
    assert [as_json(r) for r in back] == [as_json(i) for i in built]
    assert {(r.status, r.source) for r in back} == {("open", None)}   # an event: no file status, no source yet

    # the supervisor's exit rule, through its monitor, into incidents.jsonl and back: the same type
    line = "RuntimeError: injected crash at step 13 on rank 1"
    run = crashed_run(tmp_path, 1, 1, {1: TRACEBACK.format(r=1, last=line), 0: TRACEBACK.format(r=0, last=PEER)})
    filed = read_records(run.paths.incidents, parse_incident)
    assert [(type(r), r.code, r.source, r.status) for r in filed] == [(IncidentLine, "crash", "supervisor", "open")]
    assert filed[0].evidence["line"] == line and filed[0].t == run.now

    # the viewer keeps the same type: a copy of the line, its status and source its own
    st = load_run_state(run.paths.root)
    assert [(type(i), i.code, i.source) for i in st.incidents] == [(IncidentLine, "crash", "supervisor")]
    assert st.incidents[0] is not filed[0] and st.incidents[0].fields() == filed[0].fields()


def test_the_bytes_written_are_the_ones_runs_already_hold(tmp_path: Path) -> None:
    write_events(tmp_path / "events.jsonl", rank0_incidents())
    got = (tmp_path / "events.jsonl").read_bytes()
    want = (RECORDED / "rank0-events.jsonl").read_bytes()
    assert WHEN.sub(b'"t":0', got).splitlines() == WHEN.sub(b'"t":0', want).splitlines()
    # the FakeRun's clock is simulated: its files match to the byte, times included
    run = filed_run(tmp_path / "run")
    for name in ("events.jsonl", "incidents.jsonl"):
        assert (run.paths.root / name).read_bytes() == (RECORDED / "run" / name).read_bytes(), name


def test_an_old_run_directory_still_reads(tmp_path: Path) -> None:
    root = tmp_path / "old"
    shutil.copytree(RECORDED / "run", root)
    # a line from before clipping_active had its own code (docs/events.md): still one incident
    with open(root / "events.jsonl", "a") as f:
        f.write('{"v":1,"t":1800000003.0,"kind":"incident","step":3,"code":"grad_explosion","severity":"warn",'
                '"title":"Gradient explosion at step 3","detail":"clipped on 96% of steps","advice":"lower lr",'
                '"evidence":{"reason":"clipping","clipped_share":0.96}}\n')
    st = load_run_state(root)
    assert st.bad_lines == 0
    got = [(i.code, i.step, i.status, i.source) for i in st.incidents]
    assert got == [("nan_loss", 2, "open", "engine"), ("grad_explosion", 3, "open", "engine"),
                   ("stop_cut_short", 7, "closed", "supervisor")]
    nan = st.incidents[0]
    assert nan.detail.endswith("; more") and nan.evidence["verdict"] == "x" and nan.evidence["sample_indices"] == [20]
    assert nan.t == T0 + 0.2   # when the engine wrote it (its event, read first)
    assert isinstance(parse_incident((root / "incidents.jsonl").read_bytes().splitlines()[-1]), IncidentLine)
    # a monitor started on it carries on: nan_loss open (not copied again), stop_cut_short closed
    monitor = IncidentMonitor(root, MonitorConfig())
    assert set(monitor.open) == {"nan_loss"}
    before = (root / "incidents.jsonl").read_bytes()
    out = monitor.poll(now=T0 + 7)
    assert [(r["code"], r["status"], r["source"]) for r in out] == [("grad_explosion", "open", "engine")]
    assert (root / "incidents.jsonl").read_bytes().startswith(before)
