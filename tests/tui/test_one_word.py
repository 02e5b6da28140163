"""One word for "not available" everywhere the viewer and mt's messages print a missing value, and
one formatter for a run's `step X/Y` (issue #35 item 6)."""
from __future__ import annotations

from pathlib import Path

from mt.contract.fmt import NA, human_bytes, short_num
from mt.contract.status import Status
from tui.format.fmt import fmt_best, fmt_loss_cell, fmt_mb_rate, fmt_ms, fmt_s, fmt_step
from tui.read.rundir import effective_state
from tui.report.summary import format_summary
from tui.state.compare import run_line
from tui.state.runstate import RunState
from tui.widgets.header import render_header


def test_every_missing_value_is_the_one_word(tmp_path: Path) -> None:
    assert NA == "N/A"
    singles = [human_bytes(None), short_num(None), fmt_s(None), fmt_ms(None), fmt_loss_cell(None),
               fmt_best(None, None), fmt_mb_rate(5, 0.0), effective_state(Status())]
    assert singles == [NA] * len(singles)
    blank = RunState(run_dir=tmp_path, name="r")
    summary = format_summary(blank, now=0.0)
    assert "step N/A/N/A" in summary and "world N/A x N/A" in summary and "precision N/A" in summary, summary
    header = render_header(blank, 0.0, 120, 0.0, False).plain
    assert "step N/A/N/A" in header and "N/A × N/A" in header and "eff.batch N/A" in header, header
    row = run_line("r", blank)
    assert (row.step, row.loss, row.best, row.tokens) == ("N/A/N/A", NA, NA, NA)


def test_step_of_total_is_one_formatter() -> None:
    assert fmt_step(1200, 5000) == "1200/5000" and fmt_step(1200, 5000, grouped=True) == "1,200/5,000"
    assert fmt_step(None, 10) == "N/A/10" and fmt_step(3, None) == "3/N/A"


def test_the_shown_state_is_lost_when_the_supervisor_is_gone(tmp_path: Path) -> None:
    st = RunState(run_dir=tmp_path, name="r", state="running", supervisor_lost=True)
    assert st.shown_state == "lost" == run_line("r", st).state
    assert "[lost]" in format_summary(st, now=0.0) and " LOST " in render_header(st, 0.0, 120, 0.0, False).plain


def test_one_tolerant_integer_reader(tmp_path: Path) -> None:
    """status.json, config.json and a node's exit file read a whole number the same way: 3 and 3.0
    are 3; a fraction, a bool or text is no number."""
    from mt.contract.events import as_int
    from mt.contract.jsonl import write_json_atomic
    from mt.contract.status import read_status
    from tui.state.runstate import new_state

    assert [as_int(v) for v in (3, 3.0, 2.5, True, "3", float("inf"))] == [3, 3, None, None, None, None]
    for raw, want in ((7.0, 7), (2.5, None), (True, None)):
        write_json_atomic(tmp_path / "config.json", {"train": {"max_steps": raw}})
        write_json_atomic(tmp_path / "status.json", {"state": "running", "attempt": raw})
        assert (new_state(tmp_path).max_steps, read_status(tmp_path).attempt) == (want, want), raw


def test_one_poll_loop_waits_for_a_file_and_gives_up_at_its_deadline(tmp_path: Path) -> None:
    """poll_until answers as soon as a real process has written the file, and at the deadline with
    the last answer when nothing comes (the probe still ran at least once)."""
    import subprocess
    import sys
    import time

    from tui.read.wait import poll_until

    flag = tmp_path / "flag"
    writer = subprocess.Popen([sys.executable, "-c", f"import pathlib; pathlib.Path({str(flag)!r}).write_text('x')"])
    try:
        assert poll_until(flag.exists, 60.0, 0.02) is True
    finally:
        writer.wait(timeout=60)
    probes: list[float] = []
    t0 = time.monotonic()
    assert poll_until(lambda: probes.append(time.monotonic()) or None, 0.3, 0.05) is None
    assert time.monotonic() - t0 >= 0.3 and len(probes) >= 2 and probes[-1] - t0 >= 0.3
    assert poll_until(lambda: 5, 0.0, 1.0, done=lambda v: v > 9) == 5   # a wait of 0 still looks once


def test_one_byte_formatter_fits_its_unit_or_takes_the_one_given() -> None:
    """human_bytes is the one byte formatter: mt's messages, the GPU panel's GiB, mt prepare's MB."""
    from tui.format.fmt import fmt_gib, fmt_mb

    assert [human_bytes(n) for n in (0, 1023, 1536, 5 * 2**30, 3 * 2**40)] == ["0 B", "1023 B", "1.5 KiB", "5.0 GiB", "3.0 TiB"]
    assert human_bytes(12.5 * 2**30, "GiB", suffix=False) == fmt_gib(12.5 * 2**30) == "12.5"
    assert fmt_mb(1_234_567) == human_bytes(1_234_567, "MB", suffix=False) == "1.2" and fmt_mb_rate(2_000_000, 2.0) == "1.0"
    assert human_bytes(None) == fmt_gib("12") == fmt_gib(True) == NA
    assert len(fmt_gib(1e300)) <= 16 and len(human_bytes(1e308)) <= 20   # a hostile file's number stays narrow


def test_one_line_buffer_keeps_the_unfinished_line_for_every_tail(tmp_path: Path) -> None:
    """JsonlTail and the log panel's LogTail split lines with the one LineBuffer: a line is seen once it ends."""
    from mt.contract.jsonl import JsonlTail, LineBuffer
    from tui.read.watcher import LogTail

    buf = LineBuffer()
    assert buf.feed(b"a\nb") == [b"a"] and buf.partial == b"b" and buf.feed(b"c\n") == [b"bc"] and buf.partial == b""
    events, log = tmp_path / "events.jsonl", tmp_path / "rank0.log"
    events.write_bytes(b'{"k": 1}\n{"k": ')
    log.write_bytes(b"first\nsecond half")
    jt, lt = JsonlTail(events), LogTail(log)
    assert jt.read_new() == [{"k": 1}] and lt.poll() == ["first"] and lt.pending() == "second half"
    with events.open("ab") as f:
        f.write(b'2}\n')
    with log.open("ab") as f:
        f.write(b" done\n")
    assert jt.read_new() == [{"k": 2}] and lt.poll() == ["second half done"] and lt.pending() == ""
    assert isinstance(jt._lines, LineBuffer) and isinstance(lt._lines, LineBuffer)
