"""events.idx: one record per events.jsonl line, repaired by the writer after every way a run can die."""
from __future__ import annotations

import os
from pathlib import Path

from mt.contract.eventindex import HEADER, KIND_BAD, KIND_OTHER, MAGIC, RECORD, VERSION, IndexWriter, index_path, open_index
from mt.contract.eventlog import EventWriter
from mt.contract.jsonl import read_events

from .runner import index_problem


def emit_steps(w: EventWriter, steps: range, loss: float = 1.0) -> None:
    for s in steps:
        w.emit("step", step=s, epoch=0, loss=loss / s, lr=1e-3, grad_norm=0.5, clipped=False,
               tokens_per_s=100.0, step_time_s=0.1, data_wait_s=0.0, samples_seen=s, tokens_seen=s,
               skipped=False, mem_alloc_bytes=0, mem_peak_bytes=0)


def test_every_line_gets_a_record_that_matches_it(tmp_path):
    ev = tmp_path / "events.jsonl"
    w = EventWriter(ev)
    emit_steps(w, range(1, 30))
    w.emit("eval", step=29, val_loss=float("nan"))
    w.emit("step", step=30, epoch=0, loss=float("inf"), lr=None, grad_norm="x", clipped=False, tokens_per_s=1.0,
           step_time_s=0.1, data_wait_s=0.0, samples_seen=1, tokens_seen=1, skipped=True, mem_alloc_bytes=0,
           mem_peak_bytes=0)
    w.emit("checkpoint", step=30, path="c", bytes=1, seconds=0.1, reason="final", request_id=None)
    w.emit("run_end", step=30, status="completed", reason="done")
    w.close()
    assert index_problem(ev) is None
    assert (os.path.getsize(index_path(ev)) - HEADER.size) // RECORD.size == 33


def test_writer_repairs_a_torn_record_a_lagging_index_and_a_torn_line(tmp_path):
    ev = tmp_path / "events.jsonl"
    w = EventWriter(ev)
    emit_steps(w, range(1, 11))
    w.close()
    with open(index_path(ev), "ab") as f:      # killed mid-record
        f.write(b"\x01" * 10)
    w = EventWriter(ev)
    emit_steps(w, range(11, 13))
    w.close()
    assert index_problem(ev) is None
    lines = ev.read_bytes().splitlines(keepends=True)
    with open(ev, "ab") as f:                  # killed between the line and its record
        f.write(lines[3])
    w = EventWriter(ev)
    emit_steps(w, range(13, 15))
    w.close()
    assert index_problem(ev) is None
    with open(ev, "ab") as f:                  # killed mid-line
        f.write(b'{"v":1,"t":1.0,"ki')
    w = EventWriter(ev)
    emit_steps(w, range(15, 17))
    w.close()
    assert index_problem(ev) is None
    recs = index_path(ev).read_bytes()[HEADER.size:]
    kinds = [RECORD.unpack(recs[i:i + RECORD.size])[1] for i in range(0, len(recs), RECORD.size)]
    assert kinds.count(KIND_BAD) == 1          # the fragment is one bad line of its own
    assert [e["step"] for e in read_events(ev)][-3:] == [14, 15, 16]


def test_an_index_of_other_contents_is_rebuilt(tmp_path):
    ev = tmp_path / "events.jsonl"
    w = EventWriter(ev)
    emit_steps(w, range(1, 20))
    w.close()
    other = tmp_path / "other.jsonl"           # events.jsonl replaced by a shorter, different file
    w = EventWriter(other, index=False)
    emit_steps(w, range(1, 5), loss=7.0)
    w.close()
    os.replace(other, ev)
    w = EventWriter(ev)
    emit_steps(w, range(5, 7))
    w.close()
    assert index_problem(ev) is None


def test_too_much_to_catch_up_leaves_a_prefix_index(tmp_path):
    ev = tmp_path / "events.jsonl"
    w = EventWriter(ev)
    emit_steps(w, range(1, 5))
    w.close()
    prefix = index_path(ev).read_bytes()
    w = EventWriter(ev, index=False)           # a writer that kept no index
    emit_steps(w, range(5, 400))
    w.close()
    assert open_index(ev, catch_up_bytes=1000) is None
    assert index_path(ev).read_bytes() == prefix  # still true for the lines it covers


def test_a_failed_index_write_stops_the_index_not_the_run(tmp_path, capfd):
    ev = tmp_path / "events.jsonl"
    w = EventWriter(ev)
    emit_steps(w, range(1, 3))
    w._index.close()
    w._index = IndexWriter(Path("/dev/full"), os.open("/dev/full", os.O_WRONLY), 0, [0] * 6)  # ENOSPC on every write
    emit_steps(w, range(3, 6))
    w.close()
    assert "/dev/full" in capfd.readouterr().err
    assert [e["step"] for e in read_events(ev)] == [1, 2, 3, 4, 5]
    EventWriter(ev).close()                     # the next writer catches the index up
    assert index_problem(ev) is None


def test_the_header_names_the_newest_record_of_each_kind_even_after_a_kill(tmp_path):
    ev = tmp_path / "events.jsonl"
    w = EventWriter(ev)
    w.emit("checkpoint", step=0, path="c0", bytes=1, seconds=0.1, reason="interval", request_id=None)
    emit_steps(w, range(1, 4))
    w.emit("eval", step=3, val_loss=1.0)
    w.emit("checkpoint", step=3, path="c3", bytes=1, seconds=0.1, reason="interval", request_id=None)
    w.close()
    assert index_problem(ev) is None
    idx = index_path(ev)
    stale = HEADER.pack(MAGIC, VERSION, 8, 0, 5, 1, 0, 0, 0)   # killed before the header named record 6
    idx.write_bytes(stale + idx.read_bytes()[HEADER.size:])
    EventWriter(ev).close()
    assert index_problem(ev) is None
    ahead = HEADER.pack(MAGIC, VERSION, 8, 0, 5, 99, 0, 0, 0)  # killed catching up: header written, records not
    idx.write_bytes(ahead + idx.read_bytes()[HEADER.size:])
    EventWriter(ev).close()
    assert index_problem(ev) is None


def test_lines_from_elsewhere_are_indexed_without_failing_the_writer(tmp_path):
    ev = tmp_path / "events.jsonl"
    t = 1_800_000_000
    ev.write_text(f'{{"v":1,"t":{t},"kind":["not","a","string"],"step":1}}\n'
                  f'{{"v":1,"t":{t},"kind":"step","step":' + "9" * 400 + ',"loss":"nan","lr":true}\n'
                  f'[1,2,3]\n\n{{"v":1,"t":{t},"kind":"eval","step":"x","val_loss":1}}\n'
                  f'{{"v":1,"t":{t},"kind":"eval","step":3,"val_loss":1e400}}\n{{"v":1,"t":{t},"kind":"news"}}\n')
    w = EventWriter(ev)
    emit_steps(w, range(1, 3))
    w.close()
    assert index_problem(ev) is None
    recs = list(RECORD.iter_unpack(index_path(ev).read_bytes()[HEADER.size:]))
    # what mt.contract.records rejects is marked bad; a valid eval and an event of a kind unknown here are not
    assert [r[1] for r in recs] == [KIND_BAD, KIND_BAD, KIND_BAD, KIND_BAD, 2, KIND_OTHER, 0, 0]
    assert recs[4][2] == 3 and recs[4][4] == float("inf")


def test_the_fast_step_record_equals_the_parsers_or_declines():
    """The writer's per-step shortcut must give exactly the record the parser-based encode gives."""
    import json
    import math

    from mt.contract.eventindex import encode, step_record
    from mt.contract.events import dumps
    from mt.contract.records import parse_event

    base = {"v": 1, "t": 1.8e9, "kind": "step", "step": 7, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.5,
            "tokens_per_s": None, "epoch": None, "tokens_seen": 4096}
    variants = [{}, {"loss": float("nan")}, {"loss": -math.nan}, {"loss": float("inf")}, {"lr": None}, {"loss": 3},
                {"lr": -1.0}, {"step": -1}, {"step": 2.0}, {"tokens_seen": 1.5}, {"extra": {"acc": "x"}},
                {"extra": {"acc": 1.0}}, {"t": 5.0}, {"v": 2}, {"mfu": float("nan")}, {"step": True}]
    took = 0
    for over in variants:
        ev = {**base, **over}
        fast = step_record(ev, 100)
        from_line = encode(parse_event(dumps(ev)), 100)
        if fast is not None:
            took += 1
            assert fast == from_line == encode(parse_event(ev), 100), over
    assert took >= 6  # the shortcut is the common case, not a branch never taken
    assert json.loads(dumps({**base, "loss": float("nan")}))["loss"] == "nan"
