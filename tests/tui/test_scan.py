"""The bulk read (the engine's index, the column scanner) and the tail-first quick read agree with
the line-by-line follower (the reference) on the same bytes."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from mt.contract.events import dumps
from mt.contract.records import RecordTail
from tests.tui.synth import SynthRun, finished_run
from tui.read import bulk as scan
from tui.read import follower
from tui.read.bulk import bulk_read, quick_state
from tui.read.follower import RunFollower, load_run_state

FIELDS = ("step", "loss", "best_loss", "best_loss_step", "val_loss", "lr", "grad_norm", "tokens_per_s",
          "attempt", "state", "n_steps", "bad_lines", "world_size", "device", "run_end_status")


def reference(run_dir):
    f = RunFollower(run_dir)
    f.events = RecordTail(f.paths.events)  # plain line-by-line reading, never the bulk path
    f.opened = True
    f.poll()
    return f


def same(a, b) -> None:
    for name in FIELDS:
        va, vb = getattr(a, name), getattr(b, name)
        assert va == vb or (isinstance(va, float) and math.isnan(va) and math.isnan(vb)), name
    ea, eb = a.eta_s(), b.eta_s()
    assert (ea is None and eb is None) or ea == pytest.approx(eb)
    assert (a.last_checkpoint and a.last_checkpoint.step) == (b.last_checkpoint and b.last_checkpoint.step)
    assert [(i.code, i.step) for i in a.incidents] == [(i.code, i.step) for i in b.incidents]


def same_series(fa, sb) -> None:
    for name, s in fa.series.all().items():
        xa, ya = s.arrays()
        xb, yb = sb.all()[name].arrays()
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb, equal_nan=True), name


def messy_run(tmp_path, steps: int = 300):
    """Resumed attempt, nan/inf values, garbage lines, an incident, evals, a key-order change."""
    r = SynthRun(tmp_path, max_steps=steps)
    r.run_start()
    for s in range(1, 121):
        r.step(s, loss=float("nan") if s == 50 else None)
        if s % 40 == 0:
            r.event("eval", step=s, val_loss=2.0 + 1 / s)
            r.event("checkpoint", step=s, path=f"c/{s}", bytes=1, seconds=0.1, reason="interval", request_id=None)
    r.lines.append("{broken json")
    r.lines.append("")
    r.event("incident", step=77, code="loss_spike", severity="warn", title="spike", detail="",
            advice="", evidence={"loss": 9})
    r.event("run_end", step=120, status="failed", reason="rank 1 crashed")
    r.run_start(attempt=2, start_step=80)
    for s in range(81, steps + 1):
        r.step(s, grad_norm=float("inf") if s == 200 else 0.5)
    # the writer changed its key order: still parsed (by relearning or the JSON fallback)
    ev = json.loads(r.lines[-1])
    r.lines.append(dumps({k: ev[k] for k in reversed(list(ev))} | {"step": steps + 1}))
    r.flush()
    return r


def test_bulk_equals_line_by_line(tmp_path):
    messy_run(tmp_path)
    ref = reference(tmp_path)
    bulk = bulk_read(tmp_path)
    same(ref.state, bulk.state)
    same_series(ref, bulk.series)
    assert bulk.state.bad_lines == 1 and bulk.end == os.path.getsize(tmp_path / "events.jsonl")


def test_a_big_run_without_the_index_is_scanned_and_nothing_written_into_it(tmp_path, monkeypatch):
    """The engine's index is the one big-run index: a run without it is scanned whole, every open,
    and no reader writes into its directory (there was a second index, the viewer's .mt-index/)."""
    r = messy_run(tmp_path)
    monkeypatch.setattr(follower, "BULK_MIN_BYTES", 1000)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    ref = reference(tmp_path)
    for _ in range(2):
        f = RunFollower(tmp_path)
        f.poll()
        assert f.events.offset == os.path.getsize(r.paths.events)
        same(ref.state, f.state)
        same_series(ref, f.series)
    monkeypatch.setattr(scan, "QUICK_TAIL_BYTES", 4096)
    assert load_run_state(tmp_path).best_loss_partial     # `--once`: tail-first without an index
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_the_newest_steps_behind_many_other_events_are_read_alike(tmp_path):
    """The bulk read folds its columns with the state's one step fold and takes what columns lack
    (step time, the ETA window) from the newest attempt's step lines, however far back they lie."""
    r = messy_run(tmp_path)
    for k in range(1500):        # over 64 KiB of evals after the last step
        r.event("eval", step=301, val_loss=2.0 + k / 1e4)
    r.flush()
    ref = reference(tmp_path)
    scanned = bulk_read(tmp_path)
    indexed(tmp_path)
    from_index = bulk_read(tmp_path)
    assert from_index.from_index == from_index.end
    for bulk in (scanned, from_index):
        same(ref.state, bulk.state)
        assert (bulk.state.step_time_s, bulk.state.tokens_per_s) == (ref.state.step_time_s, ref.state.tokens_per_s)
        assert list(bulk.state.recent) == list(ref.state.recent)
    r.run_start(attempt=3, start_step=300)   # a new attempt, no step yet: the older steps are not its
    r.flush()
    ref = reference(tmp_path)
    bulk = bulk_read(tmp_path)
    same(ref.state, bulk.state)
    assert not bulk.state.recent and not ref.state.recent and bulk.state.step == ref.state.step == 300


def test_half_written_last_line_is_left_for_the_follower(tmp_path):
    r = messy_run(tmp_path)
    r.step(999)
    with open(r.paths.events, "a") as f:
        f.write(r.lines[-1][:30])
    b = bulk_read(tmp_path)
    assert b.state.step == 301 and b.end == os.path.getsize(r.paths.events) - 30


def test_quick_state_is_latest_with_partial_best(tmp_path):
    messy_run(tmp_path)
    ref = reference(tmp_path).state
    q, _ = quick_state(tmp_path, tail_bytes=4096)
    for name in ("step", "loss", "lr", "attempt", "state", "world_size", "run_end_status"):
        assert getattr(q, name) == getattr(ref, name), name
    assert q.last_checkpoint.step == ref.last_checkpoint.step and q.val_loss == ref.val_loss
    assert q.best_loss_partial and q.best_loss >= ref.best_loss


def test_follower_and_load_run_state_use_the_bulk_path_on_big_files(tmp_path, monkeypatch):
    r = messy_run(tmp_path)
    monkeypatch.setattr(follower, "BULK_MIN_BYTES", 1000)
    monkeypatch.setattr(scan, "QUICK_TAIL_BYTES", 4096)
    ref = reference(tmp_path)
    st = load_run_state(tmp_path)           # no cache yet: tail-first, partial best
    assert st.step == ref.state.step and st.best_loss_partial
    f = RunFollower(tmp_path)               # the viewer's follower scans it whole
    f.poll()
    same(ref.state, f.state)
    same_series(ref, f.series)
    with open(r.paths.events, "a") as fh:   # and keeps following from where the scan ended
        r.step(302)
        fh.write(r.lines[-1] + "\n")
    assert f.poll().new_steps == 1 and f.state.step == 302
    indexed(tmp_path)
    exact = load_run_state(tmp_path)        # with the engine's index: exact
    assert not exact.best_loss_partial and exact.best_loss == ref.state.best_loss


def test_quick_state_window_takes_run_start_from_the_head_and_checkpoint_from_disk(tmp_path, monkeypatch):
    r = SynthRun(tmp_path, max_steps=500)
    r.run_start()
    for s in range(1, 201):
        r.step(s)
        if s == 10:
            r.event("checkpoint", step=10, path="checkpoints/step-10", bytes=1, seconds=0.1,
                    reason="interval", request_id=None)
    r.flush()
    r.status("running")
    folder = tmp_path / "checkpoints" / "step-10"
    folder.mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-20").mkdir()  # no manifest (a copy in progress): no checkpoint for any reader
    files = {n: {"sha256": "0" * 64, "bytes": 1} for n in ("model.pt", "optim.pt", "train.pt")}
    for name in files:
        (folder / name).write_bytes(b"x")
    (folder / "manifest.json").write_text(json.dumps({"format": "mt-checkpoint", "version": 1, "files": files}))
    monkeypatch.setattr(scan, "QUICK_SCAN_BYTES", 2000)
    q, _ = quick_state(tmp_path, tail_bytes=2000)
    ref = reference(tmp_path).state
    assert (q.step, q.world_size, q.device, q.attempt, q.state) == \
        (ref.step, ref.world_size, ref.device, ref.attempt, ref.state)
    assert q.last_checkpoint.step == 10 and q.last_checkpoint.path.endswith("step-10")



# ---------------------------------------------------------------- the engine's binary index


def indexed(run_dir):
    """Index events.jsonl the way an engine writer opening it would (catching up every line)."""
    from mt.contract.eventindex import open_index
    open_index(run_dir / "events.jsonl", catch_up_bytes=1 << 30).close()


def test_bulk_read_from_the_engine_index_equals_line_by_line(tmp_path):
    messy_run(tmp_path)
    indexed(tmp_path)
    ref = reference(tmp_path)
    bulk = bulk_read(tmp_path)
    assert bulk.from_index == bulk.end == os.path.getsize(tmp_path / "events.jsonl")  # nothing scanned
    same(ref.state, bulk.state)
    same_series(ref, bulk.series)


def test_a_lagging_index_is_used_and_the_rest_scanned(tmp_path):
    r = messy_run(tmp_path)
    indexed(tmp_path)
    covered = os.path.getsize(r.paths.events)
    with open(r.paths.events, "a") as f:     # lines the engine wrote after the index's last record
        for s in range(302, 330):
            r.step(s)
            f.write(r.lines[-1] + "\n")
    ref = reference(tmp_path)
    bulk = bulk_read(tmp_path)
    assert bulk.from_index == covered and bulk.state.step == 329
    same(ref.state, bulk.state)
    same_series(ref, bulk.series)


@pytest.mark.parametrize("damage", ["replaced", "line_removed", "record_changed", "garbage"])
def test_an_index_that_disagrees_with_events_jsonl_is_ignored(tmp_path, damage):
    from mt.contract.eventindex import index_path
    r = messy_run(tmp_path)
    indexed(tmp_path)
    idx = index_path(r.paths.events)
    if damage == "replaced":                # another run's events.jsonl of about the same size
        other = tmp_path / "other"
        finished_run(other, steps=300)
        os.replace(other / "events.jsonl", r.paths.events)
    elif damage == "line_removed":          # someone edited the file: every later offset moved
        lines = r.paths.events.read_bytes().splitlines(keepends=True)
        r.paths.events.write_bytes(b"".join(lines[:5] + lines[6:]))
    elif damage == "record_changed":        # the last record's loss no longer matches its line
        data = bytearray(idx.read_bytes())
        data[-3 * 8 - 1] ^= 0x40           # the top byte of the loss field
        idx.write_bytes(bytes(data))
    else:
        idx.write_bytes(b"not an index at all" * 10)
    ref = reference(tmp_path)
    bulk = bulk_read(tmp_path)
    assert bulk.from_index == 0
    same(ref.state, bulk.state)
    same_series(ref, bulk.series)


def test_watch_once_is_exact_from_the_index(tmp_path, monkeypatch):
    messy_run(tmp_path)
    indexed(tmp_path)
    monkeypatch.setattr(follower, "BULK_MIN_BYTES", 1000)
    st = load_run_state(tmp_path)
    ref = reference(tmp_path).state
    same(ref, st)
    assert not st.best_loss_partial


def test_quick_state_from_the_index_tail_is_the_newest_state(tmp_path, monkeypatch):
    from tui.read import index_tail
    messy_run(tmp_path)
    indexed(tmp_path)
    ref = reference(tmp_path).state
    monkeypatch.setattr(index_tail, "TAIL_RECORDS", 40)   # the newest run_start, eval, checkpoint... lie before it
    q = index_tail.quick_read_index(tmp_path)
    assert q.series is None and q.end == os.path.getsize(tmp_path / "events.jsonl")
    st = q.state
    for name in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "attempt", "state", "world_size",
                 "device", "precision", "effective_batch", "max_steps", "start_step", "val_loss", "val_loss_step",
                 "run_end_status"):
        assert getattr(st, name) == getattr(ref, name), name
    assert st.last_checkpoint.step == ref.last_checkpoint.step and st.eta_s() == pytest.approx(ref.eta_s())
    assert st.best_loss_partial and st.best_loss >= ref.best_loss
    monkeypatch.setattr(index_tail, "TAIL_RECORDS", 10_000)  # the whole file: exact
    whole = index_tail.quick_read_index(tmp_path).state
    assert not whole.best_loss_partial and whole.best_loss == ref.best_loss


def test_every_reader_opens_a_big_run_by_one_policy(tmp_path, monkeypatch):
    """The dashboard's watcher, `mt ls` and `mt watch --once` ask RunFollower.newest_first: the
    index tail first (when asked), else events.jsonl's tail unless the index covers it."""
    from tui.read import index_tail
    from tui.read.watcher import Watcher
    messy_run(tmp_path)
    monkeypatch.setattr(follower, "BULK_MIN_BYTES", 1000)
    monkeypatch.setattr(scan, "QUICK_TAIL_BYTES", 4096)
    monkeypatch.setattr(index_tail, "TAIL_RECORDS", 40)
    ref = reference(tmp_path).state
    assert RunFollower(tmp_path).newest_first(tail=False) is None and not Watcher(tmp_path).open_quick()
    tail = RunFollower(tmp_path).newest_first()
    assert tail.state.step == ref.step and tail.state.best_loss_partial and tail.from_index == 0
    indexed(tmp_path)
    assert RunFollower(tmp_path).newest_first(index=False) is None   # the index makes the full read fast
    w = Watcher(tmp_path)
    assert w.open_quick()
    ls = load_run_state(tmp_path, exact_best=False)
    assert w.follower.state.step == ls.step == ref.step and w.follower.state.best_loss == ls.best_loss
    assert ls.best_loss_partial and not load_run_state(tmp_path).best_loss_partial
    monkeypatch.setattr(follower, "BULK_MIN_BYTES", 1 << 40)   # not big: every reader reads it whole
    assert RunFollower(tmp_path).newest_first() is None and not Watcher(tmp_path).open_quick()


def test_quick_state_from_the_index_refuses_an_index_of_other_contents(tmp_path):
    from tui.read import index_tail
    messy_run(tmp_path)
    indexed(tmp_path)
    other = tmp_path / "other"
    finished_run(other, steps=300)
    os.replace(other / "events.jsonl", tmp_path / "events.jsonl")
    assert index_tail.quick_read_index(tmp_path) is None
    assert index_tail.quick_read_index(other) is None          # no index at all


def test_mt_ls_reads_a_big_indexed_run_from_the_index_tail_without_numpy(tmp_path):
    import subprocess
    import sys
    r = SynthRun(tmp_path / "big", max_steps=20_000)
    r.run_start()
    for s in range(1, 16_001):
        r.step(s)
    r.flush()
    r.status("running")
    assert os.path.getsize(r.paths.events) > follower.BULK_MIN_BYTES
    indexed(r.root)
    ref = reference(r.root).state
    code = ("import sys; from pathlib import Path; from tui.report.runs import run_row; row = run_row(Path(sys.argv[1])); "
            "print(row.step, row.loss, row.attempt, 'numpy' in sys.modules, sep='|')")
    out = subprocess.run([sys.executable, "-c", code, str(r.root)], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__)))).stdout.strip().split("|")
    assert out == [f"{ref.step}/20000 ep 0", f"{ref.loss:.4f}", str(ref.attempt), "False"]   # the newest line's epoch


def test_lines_from_elsewhere_never_break_any_reader(tmp_path):
    from mt.contract.eventlog import EventWriter
    from tui.read.index_tail import quick_read_index
    r = SynthRun(tmp_path)
    r.run_start()
    r.step(1)
    t = 1_800_000_000
    r.lines += [f'{{"v":1,"t":{t},"kind":["a"],"step":1}}', '[1,2]',
                f'{{"v":1,"t":{t},"kind":"step","step":' + "9" * 400 + ',"loss":"nan","lr":1}',
                f'{{"v":1,"t":{t},"kind":"step","step":3,"loss":"nan","lr":true}}',
                f'{{"v":1,"t":{t},"kind":"eval","step":"x","val_loss":1}}', f'{{"v":1,"t":{t},"kind":"step","step":"y"}}',
                f'{{"v":1,"t":{t},"kind":"eval","step":1,"val_loss":1e400}}']
    r.step(2)
    r.flush()
    EventWriter(r.paths.events).close()        # an engine writer indexes what it finds
    ref = reference(tmp_path)
    bulk = bulk_read(tmp_path)
    quick = quick_read_index(tmp_path).state
    assert bulk.from_index == bulk.end           # the index covered the odd lines too
    for st in (ref.state, bulk.state, quick):
        # six lines no reader may use (a kind that is a list, a list, a step beyond 2**63, lr true,
        # steps "x" and "y"); the eval whose val_loss overflows to inf is a valid (diverged) one
        assert st.step == 2 and st.bad_lines == 6 and st.val_loss == float("inf")
    same_series(ref, bulk.series)
    assert ref.series.loss.arrays()[0].tolist() == [1.0, 2.0]   # no point without a usable step


def test_the_one_step_fold_is_the_same_for_records_and_columns(tmp_path):
    """runstate.reduce_rows over numpy columns (the bulk read) equals reduce_step record by record."""
    from mt.contract.records import parse_event
    from tui.state.runstate import new_state, reduce_rows, reduce_step
    rng = np.random.default_rng(0)
    loss = rng.random(5000) * 3
    loss[rng.integers(0, 5000, 200)] = np.nan
    loss[[7, 900]], loss[[8, 901]] = -np.inf, np.inf
    rows = np.column_stack([np.arange(1, 5001), loss, rng.random((5000, 3))])
    one = new_state(tmp_path)
    for r in rows.tolist():
        ev = parse_event({"kind": "step", "t": 1.8e9, "step": int(r[0]), "loss": None if math.isnan(r[1]) else r[1],
                          "lr": r[2], "grad_norm": r[3], "tokens_per_s": r[4]})
        reduce_step(one, ev)
    many = new_state(tmp_path)
    reduce_rows(many, *rows[:2500].T)
    reduce_rows(many, *rows[2500:].T)
    assert many.best_history == one.best_history and len(one.best_history) > 3
    assert (many.step, many.n_steps, many.loss, many.lr, many.tokens_per_s, many.state) == \
        (one.step, one.n_steps, one.loss, one.lr, one.tokens_per_s, one.state)


def test_a_long_tail_of_other_lines_is_looked_back_over_in_bounded_reads(tmp_path):
    """Behind 20 MB of over-long lines after the last step, the bulk read ends, reads at most a
    few MiB at a time, and leaves what it could not find unknown (the look-back is bounded)."""
    import tracemalloc
    r = messy_run(tmp_path)
    r.lines += ['{"v":1,"kind":"note","pad":"' + "x" * (2 << 20) + '"}'] * 10
    r.flush()
    del r.lines
    tracemalloc.start()
    try:
        bulk = bulk_read(tmp_path, keep_series=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert bulk.state.step == 301 and bulk.state.bad_lines == 11 and not bulk.state.recent
    assert peak < 24 << 20, peak
