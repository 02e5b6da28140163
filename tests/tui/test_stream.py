"""RunState reduction and incremental following, on synthetic run directories."""
from __future__ import annotations

import json
import os

from mt.contract.events import dumps
from tests.tui.synth import SynthRun, finished_run, loss_at
from tui.read.follower import RunFollower, load_run_state
from tui.report.summary import format_summary


def test_finished_run_state(tmp_path):
    finished_run(tmp_path, steps=100)
    st = load_run_state(tmp_path)
    assert st.name == "synth" and st.state == "completed" and st.attempt == 1
    assert st.step == 100 and st.max_steps == 100
    assert st.loss == loss_at(100)
    best = min(range(1, 101), key=loss_at)
    assert st.best_loss == loss_at(best) and st.best_loss_step == best
    assert st.val_loss == loss_at(100) + 0.1 and st.val_loss_step == 100
    assert st.last_checkpoint.step == 100
    assert (st.world_size, st.device, st.precision, st.effective_batch) == (2, "cpu", "fp32", 32)
    assert st.run_end_status == "completed" and st.bad_lines == 0
    text = format_summary(st, now=st.ended)
    assert "[completed]" in text and "step 100/100" in text


def test_follower_reads_only_new_bytes_and_keeps_half_line(tmp_path):
    r = SynthRun(tmp_path)
    r.run_start()
    r.step(1)
    r.step(2)
    r.flush()
    f = RunFollower(tmp_path)
    f.poll()
    assert f.state.step == 2 and len(f.series.loss) == 2
    r.step(3)
    line = r.lines[-1] + "\n"
    with open(r.paths.events, "a") as fh:     # half of step 3, then garbage + the rest
        fh.write(line[:20])
    res = f.poll()
    assert f.state.step == 2 and res.new_steps == 0
    with open(r.paths.events, "a") as fh:
        fh.write(line[20:] + "{not json\n" + '"a string"\n')
    res = f.poll()
    assert f.state.step == 3 and res.new_steps == 1 and f.state.bad_lines == 2
    assert len(f.series.loss) == 3
    assert f.poll().changed is False


def test_follower_copes_with_truncation_and_replacement(tmp_path):
    finished_run(tmp_path, steps=30)
    f = RunFollower(tmp_path)
    f.poll()
    assert f.state.step == 30
    r2 = SynthRun(tmp_path)
    r2.run_start()
    r2.step(1)
    r2.step(2)
    tmp = tmp_path / "new.jsonl"
    tmp.write_text("".join(x + "\n" for x in r2.lines))
    os.replace(tmp, r2.paths.events)           # replaced by a shorter file
    f.poll()
    assert f.state.step == 2 and len(f.series.loss) == 2
    with open(r2.paths.events, "r+") as fh:   # truncated in place
        fh.truncate(0)
    f.poll()
    assert f.state.step is None and len(f.series.loss) == 0


def test_nonfinite_loss_kept_in_series_not_best(tmp_path):
    r = SynthRun(tmp_path)
    r.run_start()
    r.step(1, loss=3.0)
    r.step(2, loss=float("nan"))
    r.step(3, loss=float("inf"))
    r.flush()
    assert '"loss":"nan"' in r.paths.events.read_text()
    f = RunFollower(tmp_path)
    f.poll()
    _, y = f.series.loss.arrays()
    assert y[0] == 3.0 and y[1] != y[1] and y[2] == float("inf")
    assert f.state.best_loss == 3.0


def test_resume_truncates_series_after_checkpoint(tmp_path):
    r = SynthRun(tmp_path, max_steps=20)
    r.run_start()
    for s in range(1, 13):
        r.step(s)
    r.event("run_end", step=12, status="failed", reason="rank 1 crashed")
    r.run_start(attempt=2, start_step=10)
    r.step(11)
    r.flush()
    f = RunFollower(tmp_path)
    f.poll()
    x, _ = f.series.loss.arrays()
    assert x.tolist() == [float(s) for s in range(1, 12)]
    assert f.state.attempt == 2 and f.state.state == "running" and f.state.step == 11


def test_incidents_open_close_and_merge(tmp_path):
    r = finished_run(tmp_path, steps=10)
    inc = dict(code="loss_spike", severity="warn", step=7, title="Loss spike",
               detail="loss jumped", advice="lower lr", evidence={"loss": 9.0})
    r.event("incident", **inc)
    r.flush()
    lines = [dict(v=1, t=r.t, status="open", source="engine", **inc),
             dict(v=1, t=r.t, status="open", source="supervisor", code="hang", severity="error",
                  step=9, title="Hang", detail="", advice="", evidence={})]
    r.paths.incidents.write_text("".join(dumps(x) + "\n" for x in lines))
    st = load_run_state(tmp_path)
    assert [i.code for i in st.open_incidents] == ["loss_spike", "hang"]
    with open(r.paths.incidents, "a") as fh:
        fh.write(json.dumps(dict(lines[1], status="closed")) + "\n")
    st = load_run_state(tmp_path)
    assert [i.code for i in st.open_incidents] == ["loss_spike"]
    assert "loss_spike" in format_summary(st, now=r.t)


def test_failed_run_reason_from_status(tmp_path):
    r = SynthRun(tmp_path)
    r.run_start()
    r.step(1)
    r.event("run_end", step=1, status="failed", reason="worker exited 1")
    r.flush()
    r.status("failed", reason="rank 1 exited with code 1", exit_code=1, ended=r.t)
    st = load_run_state(tmp_path)
    assert st.state == "failed" and st.reason == "rank 1 exited with code 1"
    assert "reason: rank 1 exited with code 1" in format_summary(st, now=r.t)


def test_starting_run_without_events(tmp_path):
    SynthRun(tmp_path).status("starting")
    st = load_run_state(tmp_path)
    assert st.state == "starting" and st.step is None
    assert "step N/A/100" in format_summary(st)


def test_failing_rank_prefers_the_first_failure_over_the_reason(tmp_path):
    from tests.tui.conftest import FIXTURES
    st = load_run_state(FIXTURES / "incidents")
    assert "rank 0" in st.reason                 # the status names the rank that lost its peer,
    crash = next(i for i in st.incidents if i.code == "crash")
    assert st.failing_rank() == crash.evidence["rank"] == 1   # the crash incident the one that died
    r = SynthRun(tmp_path)
    r.status("failed", reason="rank 3 exited with code 1")
    assert load_run_state(tmp_path).failing_rank() == 3


def test_system_panel_reads_only_the_end_of_a_long_system_jsonl(tmp_path):
    from tui.read import watcher as watch
    finished_run(tmp_path, steps=5)
    t0 = 1_800_000_000.0
    sample = {"t": t0, "gpus": [{"index": 0, "util_pct": 0}], "ranks": []}
    lines = [dumps(sample | {"t": t0 + i, "gpus": [{"index": 0, "util_pct": i % 100}]}) for i in range(20_000)]
    (tmp_path / "system.jsonl").write_text("\n".join(lines) + "\n")
    w = watch.Watcher(tmp_path)
    w.poll()
    size = os.path.getsize(tmp_path / "system.jsonl")
    assert w.system.samples < 20_000 and w.system.samples * len(lines[-1]) <= watch.SYSTEM_TAIL_BYTES + len(lines[-1])
    assert w.system.sample["t"] == t0 + 19_999 and len(w.system.gpu_util[0]) == watch.HISTORY
    assert list(w.system.gpu_util[0])[-3:] == [97, 98, 99]
    with open(tmp_path / "system.jsonl", "a") as f:   # and follows what comes next
        f.write(dumps(sample | {"t": t0 + 20_000}) + "\n")
    assert w.poll().system_changed and w.system.sample["t"] == t0 + 20_000
    assert w._system_tail.bad_lines == 0 and w._system_tail.offset == size + len(dumps(sample | {"t": t0 + 20_000})) + 1


def test_an_incident_closed_by_one_source_is_not_listed_again_by_the_other(tmp_path):
    # the engine opens and closes it in events.jsonl; the monitor's copy (incidents.jsonl) comes after
    r = finished_run(tmp_path, steps=10)
    inc = dict(code="loss_spike", severity="warn", step=7, title="Loss spike",
               detail="loss jumped", advice="lower lr", evidence={"loss": 9.0})
    r.event("incident", **inc)
    r.event("incident", **dict(inc, status="closed"))
    r.flush()
    lines = [dict(v=1, t=r.t, status=s, source="supervisor", **inc) for s in ("open", "closed")]
    r.paths.incidents.write_text("".join(dumps(x) + "\n" for x in lines))
    st = load_run_state(tmp_path)
    assert [(i.code, i.step, i.status) for i in st.incidents] == [("loss_spike", 7, "closed")]


def test_the_monitors_closed_copy_read_before_the_engines_event_is_still_one_incident(tmp_path):
    # a follower can read incidents.jsonl ahead of events.jsonl: the event arriving after the
    # copy's close must not open the incident again
    r = SynthRun(tmp_path)
    r.run_start()
    for s in range(1, 8):
        r.step(s)
    r.flush()
    r.status("running")
    inc = dict(code="nan_loss", severity="warn", step=7, title="Non-finite loss",
               detail="loss nan", advice="check the data", evidence={"loss": "nan"})
    lines = [dict(v=1, t=r.t, status=s, source="engine", **inc) for s in ("open", "closed")]
    r.paths.incidents.write_text("".join(dumps(x) + "\n" for x in lines))
    f = RunFollower(tmp_path)
    f.poll()
    r.event("incident", **inc)
    r.flush()
    f.poll()
    assert [(i.code, i.step, i.status) for i in f.state.incidents] == [("nan_loss", 7, "closed")]
