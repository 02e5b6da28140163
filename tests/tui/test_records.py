"""One typed parser: every reader rejects the same lines, counts them, and keeps reading after them."""
from __future__ import annotations

import io
import json
import tracemalloc

from mt.contract.config import MonitorConfig
from mt.contract.eventlog import EventWriter
from mt.contract.jsonl import MAX_LINE_BYTES, read_events
from mt.contract.records import RecordTail, Rejected, Step, parse_event
from tests.tui.synth import SynthRun
from tui.diagnose.monitor import IncidentMonitor
from tui.read.bulk import bulk_read, quick_read
from tui.read.follower import RunFollower, load_run_state
from tui.read.index_tail import quick_read_index
from tui.report.headless import follow_run
from tui.supervise.control import wait_answer

# Each is valid JSON that cannot be true; each once broke or misled a reader.
IMPOSSIBLE = [
    {"kind": "run_start", "attempt": "x", "world_size": 2},       # the rules raised on int("x")
    {"kind": "step", "step": "NaN", "loss": 1.0},                 # became the newest step
    {"kind": "step", "step": 999, "loss": [1]},                   # became the newest step
    {"kind": "incident", "code": "hang", "severity": "error", "title": "Hang", "t": 1.0},   # "498919h ago"
    {"kind": "control", "request_id": 7, "action": "stop", "status": "accepted"},
    {"kind": "step", "step": 12, "loss": 1.0, "lr": -0.1},
]


def hostile_run(root):
    """A completed run with IMPOSSIBLE lines in the middle of one chunk, valid events after them."""
    r = SynthRun(root, max_steps=10)
    r.run_start()
    for s in range(1, 6):
        r.step(s)
    for bad in IMPOSSIBLE:
        r.lines.append(json.dumps({"v": 1, "t": r.t, **bad}))
    r.event("incident", step=5, code="loss_spike", severity="warn", title="Loss spike", detail="d",
            advice="a", evidence={"threshold": 3.0})
    r.event("control", request_id="ckpt-1", action="checkpoint", status="done", detail="")
    r.event("checkpoint", step=5, path="checkpoints/step-5", bytes=10, seconds=0.1, reason="request",
            request_id="ckpt-1")
    for s in range(6, 11):
        r.step(s)
    r.event("run_end", step=10, status="completed", reason="max_steps reached")
    r.flush()
    r.status("completed")
    return r


def test_parser_rejects_what_cannot_be_true_and_says_why():
    for bad in IMPOSSIBLE:
        rec = parse_event({"v": 1, "t": 1_800_000_000.0, **bad})
        assert isinstance(rec, Rejected) and rec.reason.startswith(bad["kind"]), bad
    assert "t 1 is not a time" in parse_event(b'{"v":1,"t":1,"kind":"eval","step":1}').reason
    assert "schema version 2" in parse_event(b'{"v":2,"t":1800000000,"kind":"eval","step":1}').reason
    ok = parse_event(b'{"v":1,"t":1800000000,"kind":"step","step":3,"loss":"nan","lr":0.1}')
    assert isinstance(ok, Step) and ok.step == 3 and ok.loss != ok.loss and ok.grad_norm is None


def test_every_reader_rejects_the_same_lines_and_reads_on(tmp_path):
    r = hostile_run(tmp_path)
    n_bad = len(IMPOSSIBLE)
    line_by_line = RunFollower(tmp_path)
    line_by_line.opened = True   # never the bulk path
    line_by_line.poll()
    states = {"viewer": line_by_line.state, "bulk": bulk_read(tmp_path).state,
              "quick": quick_read(tmp_path).state, "once": load_run_state(tmp_path)}
    EventWriter(r.paths.events).close()            # an engine writer indexes what it finds
    states["indexed"] = bulk_read(tmp_path).state
    states["index tail"] = quick_read_index(tmp_path).state
    for name, st in states.items():
        assert (st.step, st.attempt, st.bad_lines) == (10, 1, n_bad), name
        assert [i.code for i in st.incidents] == ["loss_spike"], name
        assert st.last_checkpoint is not None and st.last_checkpoint.step == 5, name
    assert "lr -0.1 is negative" in line_by_line.state.bad_reason

    # the incident rules: before, int("x") raised and the rest of the chunk was lost
    mon = IncidentMonitor(tmp_path, MonitorConfig())
    mon.poll()
    assert mon.memory.attempt == 1 and mon.memory.last_step.step == 10 and mon.events.bad_lines == n_bad
    copied = [rec for rec in read_events(r.paths.incidents) if rec.get("source") == "engine" and rec["status"] == "open"]
    assert [rec["code"] for rec in copied] == ["loss_spike"]

    out = io.StringIO()        # --headless
    assert follow_run(tmp_path, out, poll_s=0.01) == "completed"
    text = out.getvalue()
    assert "incident [warn] loss_spike at step 5" in text and "step 10/10" in text and "hang" not in text

    answer = wait_answer(tmp_path, "ckpt-1", timeout=5)     # mt ckpt
    assert answer.status == "done" and answer.checkpoint is not None and answer.checkpoint.step == 5


def test_an_over_long_line_is_skipped_cheaply_by_every_reader(tmp_path):
    r = SynthRun(tmp_path, max_steps=200)
    r.run_start()
    for s in range(1, 101):
        r.step(s)
    r.lines.append('{"v":1,"kind":"step","step":101,"note":"' + "x" * (50 << 20) + '"}')
    for s in range(101, 201):
        r.step(s)
    r.flush()
    r.status("running")
    del r.lines
    tracemalloc.start()
    try:
        once = load_run_state(tmp_path)           # `mt watch --once`: the bulk path (a big file)
        once_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        follower = RunFollower(tmp_path)
        follower.opened = True                    # the dashboard's line-by-line tail
        follower.poll()
        tail_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert once.step == 200 and once.attempt == 1 and once.loss == follower.state.loss   # tail-first: the newest steps
    assert follower.state.step == 200 and follower.state.n_steps == 200 and follower.state.bad_lines == 1
    bulk = bulk_read(tmp_path).state      # the first frame of a big run
    assert bulk.step == 200 and bulk.n_steps == 200 and bulk.bad_lines == 1
    assert f"over {MAX_LINE_BYTES} bytes" in follower.state.bad_reason
    # neither holds the 50 MB line: a few read buffers at most
    assert once_peak < 32 << 20 and tail_peak < 32 << 20, (once_peak, tail_peak)


def test_an_over_long_line_still_being_written_is_skipped_when_it_ends(tmp_path):
    path = tmp_path / "events.jsonl"
    step = '{"v":1,"t":1800000000,"kind":"step","step":%d}\n'
    path.write_text(step % 1 + '{"v":1,"kind":"step","note":"' + "x" * (2 * MAX_LINE_BYTES))
    tail = RecordTail(path)
    assert [e.step for e in tail.iter_new()] == [1] and tail.bad_lines == 1
    with open(path, "a") as f:
        f.write("x" * 1000 + '"}\n' + step % 2)
    assert [e.step for e in tail.iter_new()] == [2] and tail.bad_lines == 1


def test_a_status_json_state_that_is_no_run_state_is_ignored(tmp_path):
    r = hostile_run(tmp_path)
    for bad in ("banana", ["completed"], 7):
        r.paths.status.write_text(json.dumps({"state": bad, "attempt": 1}))
        assert load_run_state(tmp_path).state == "completed", bad     # the run_end's word stands
    r.status("failed")
    assert load_run_state(tmp_path).state == "failed"
