"""IncidentMonitor bookkeeping: engine incidents copied once and closed, file format, restarts."""
from __future__ import annotations

from pathlib import Path

from mt.contract.config import MonitorConfig
from mt.contract.events import INCIDENT_CODES
from mt.contract.incident import Incident
from mt.rules import StepRules, nan_incident
from tui.diagnose.monitor import IncidentMonitor

from .fakerun import FakeRun
from .streams import steps


def emit_incident(run: FakeRun, inc: Incident) -> None:
    run.event("incident", **inc.event_fields())


def spike_run(tmp_path: Path, m: MonitorConfig) -> FakeRun:
    """A clean curve with a 4-step loss spike at steps 101..104, the engine's rule emitting."""
    run = FakeRun(tmp_path / "r", monitor=m)
    run.start()
    stream = steps(200, 0)
    for k in range(100, 104):
        stream[k]["loss"] *= 3  # a 4-step spike at steps 101..104
    sa = StepRules(m, 1.0)
    for s in stream:
        incs = sa.observe(s)
        run.do_step(step_time=0.2, loss=s["loss"])
        for inc in incs:
            emit_incident(run, inc)
        run.poll()
    return run


def test_engine_incident_copied_once_then_closed_after_clean_steps(tmp_path: Path) -> None:
    m = MonitorConfig(close_after_s=0.0)
    run = spike_run(tmp_path, m)
    opened = run.opened("loss_spike")
    assert len(opened) == 1 and opened[0]["source"] == "engine" and opened[0]["step"] == 101
    closed = run.closed("loss_spike")
    assert len(closed) == 1
    # closed after close_after_steps clean steps following the spike
    assert closed[0]["closed_reason"] == f"{m.close_after_steps} clean steps up to step {104 + m.close_after_steps}"


def test_engine_incident_stays_open_long_enough_to_be_seen(tmp_path: Path) -> None:
    m = MonitorConfig(close_after_s=15.0)
    run = spike_run(tmp_path, m)
    opened, closed = run.opened("loss_spike")[0], run.closed("loss_spike")[0]
    assert m.close_after_s <= closed["t"] - opened["t"] <= m.close_after_s + 0.2 + 1e-6


def test_duplicate_engine_incident_while_open_is_not_repeated(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r")
    run.start()
    run.do_step(step_time=0.2)
    for step in (2, 3, 4):
        run.do_step(step_time=0.2, loss=float("nan"))
        emit_incident(run, nan_incident(step, 1e-3, float("nan"), float("nan"), [step * 10], "skip"))
        run.poll()
    got = run.opened("nan_loss")
    assert len(got) == 1 and got[0]["step"] == 2
    assert got[0]["evidence"]["sample_indices"] == [20]
    assert got[0]["evidence"]["loss"] == "nan"  # written as the string, readable back


def test_nan_with_stop_stays_open_when_the_run_fails(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r")
    run.start()
    for _ in range(5):
        run.do_step(step_time=0.2)
    emit_incident(run, nan_incident(6, 1e-3, float("inf"), float("nan"), [1, 2], "stop"))
    run.event("run_end", step=5, status="failed", reason="non-finite loss")
    run.status({"state": "failed", "attempt": 1, "exit_code": 1})
    run.poll()
    assert [r["code"] for r in run.opened()] == ["nan_loss"]
    assert run.closed() == []


def test_records_follow_the_contract(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r", monitor=MonitorConfig(hang_floor_s=5.0))
    run.start()
    for _ in range(20):
        run.do_step(step_time=0.2)
    run.idle(10)
    emit_incident(run, nan_incident(21, 1e-3, 1.0, float("nan"), [3], "skip"))
    run.poll()
    recs = run.file()
    assert {r["code"] for r in recs} == {"hang", "nan_loss"}
    for r in recs:
        assert {"v", "t", "code", "severity", "step", "title", "detail", "advice", "evidence", "status", "source"} <= set(r)
        assert r["code"] in INCIDENT_CODES and r["severity"] in ("info", "warn", "error")
        assert r["status"] in ("open", "closed") and r["source"] in ("engine", "supervisor")
        assert isinstance(r["evidence"], dict) and r["advice"]


def test_a_new_monitor_carries_on_from_the_file(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=5.0)
    run = FakeRun(tmp_path / "r", monitor=m)
    run.start()
    for _ in range(10):
        run.do_step(step_time=0.2)
    emit_incident(run, nan_incident(11, 1e-3, 1.0, float("nan"), [3], "skip"))
    run.idle(8)
    assert {r["code"] for r in run.opened()} == {"hang", "nan_loss"}
    # a supervisor restart: a fresh monitor on the same run reads everything again
    again = IncidentMonitor(run.paths.root, m)
    assert again.poll(now=run.now + 1) == []
    assert set(again.open) == {"hang", "nan_loss"}


def test_poll_reads_only_new_bytes(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r")
    run.start()
    for _ in range(50):
        run.do_step(step_time=0.2)
    size = run.paths.events.stat().st_size
    assert run.monitor.events.offset == size
    run.do_step(step_time=0.2)
    assert run.monitor.events.offset > size


def test_missing_and_torn_files_are_survived(tmp_path: Path) -> None:
    T = 1_800_000_000
    root = tmp_path / "bare"
    root.mkdir()
    mon = IncidentMonitor(root, MonitorConfig())  # no config, no events, no status yet
    assert mon.poll(now=T + 1) == []
    (root / "status.json").write_text("{not json")
    (root / "heartbeat").mkdir()
    (root / "heartbeat" / "rank0").write_text('{"step": 3, "t"')  # torn mid-rewrite
    (root / "events.jsonl").write_text(f'{{"v":1,"t":{T + 1},"kind":"run_start","attempt":1}}\n{{"v":1,"t":{T + 2},"kind":"st')
    assert mon.poll(now=T + 3) == []
    assert mon.memory.attempt == 1 and mon.events.bad_lines == 0  # the torn line waits for its end
    with open(root / "events.jsonl", "a") as f:
        f.write('ep","step":1,"loss":"nan","step_time_s":0.1,"data_wait_s":0.0,"tokens_per_s":1.0}\n')
    mon.poll(now=T + 4)
    assert mon.memory.last_step is not None and mon.memory.last_step.step == 1


def test_open_incidents_settle_when_the_engine_ends_the_run(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    run.start()
    for _ in range(30):
        run.do_step(step_time=0.25, data_wait=0.01)
    for _ in range(4):
        run.do_step(step_time=2.2, data_wait=2.0)
    assert [r["code"] for r in run.opened()] == ["dataloader_stall"]
    run.event("run_end", step=run.step, status="completed", reason="reached max_steps")
    run.poll()  # status.json still says running: the supervisor has not caught up yet
    assert [(r["code"], r["closed_reason"]) for r in run.closed()] == [("dataloader_stall", "run completed")]


def test_an_update_adds_evidence_to_the_open_incident_and_survives_a_restart(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=5.0)
    run = FakeRun(tmp_path / "r", monitor=m)
    run.start()
    for _ in range(10):
        run.do_step(step_time=0.2)
    run.idle(8)
    opened = run.opened("hang")[0]
    mon = run.monitor
    upd = mon.update("hang", {"verdict": "rank 1 is in `f` (a.py:1)"}, "stacks: rank 1 is in `f` (a.py:1)")
    assert upd is not None and upd["status"] == "update" and upd["step"] == opened["step"]
    assert upd["detail"] == f"{opened['detail']}; stacks: rank 1 is in `f` (a.py:1)"
    assert {**opened["evidence"], "verdict": "rank 1 is in `f` (a.py:1)"} == upd["evidence"]
    assert run.file()[-1] == upd and mon.update("nan_loss", {"x": 1}, "x") is None   # only an open one
    # a restarted monitor keeps it open, with the evidence, and closes it with that evidence
    again = IncidentMonitor(run.paths.root, m)
    assert again.poll(now=run.now + 1) == [] and again.open["hang"]["evidence"]["verdict"].startswith("rank 1")
    assert mon._close("hang", run.now, "test")["evidence"]["verdict"].startswith("rank 1")
