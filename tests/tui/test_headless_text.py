"""`--headless` lines and the `--once` summary: every incident, the first failing rank, resume, --every."""
from __future__ import annotations

import io
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mt.contract.events import dumps
from mt.contract.records import parse_event
from tests.cli.conftest import mt
from tests.tui.synth import SynthRun, complete, finished_run, loss_at
from tui.read.follower import load_run_state
from tui.report.headless import event_line, follow_run
from tui.report.summary import format_summary

CRASH = "RuntimeError: injected crash at step 12 on rank 1 ([faults] crash_at_step)"
PEER = "rank 0: RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"


def incident(t: float, code: str, step: int, status: str = "open", source: str = "supervisor",
             evidence: dict | None = None, severity: str = "error") -> str:
    return dumps(dict(v=1, t=t, status=status, source=source, code=code, severity=severity, step=step,
                      title=f"{code} title", detail="", advice="", evidence=evidence or {})) + "\n"


@contextmanager
def headless(run_dir: Path) -> Iterator[tuple[io.StringIO, list[str]]]:
    """`--headless` following run_dir in a thread: (what it printed, [its result once it ended])."""
    out = io.StringIO()
    result: list[str] = []
    th = threading.Thread(target=lambda: result.append(follow_run(run_dir, out, poll_s=0.02)))
    th.start()
    try:
        yield out, result
    finally:
        th.join(timeout=10)


def append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_headless_prints_every_incident_once_opened_and_closed(tmp_path: Path) -> None:
    r = SynthRun(tmp_path, max_steps=10)
    r.run_start()
    for s in range(1, 6):
        r.step(s)
    spike = dict(code="loss_spike", severity="warn", step=5, title="Loss spike", detail="", advice="", evidence={})
    r.event("incident", **spike)
    r.flush()
    r.status("running")
    with headless(tmp_path) as (out, result):
        time.sleep(0.3)
        # the supervisor copies the engine's incident, then diagnoses a hang that later clears
        append(r.paths.incidents, dumps(dict(v=1, t=r.t, status="open", source="engine", **spike)) + "\n")
        append(r.paths.incidents, incident(r.t + 1, "hang", 6))
        time.sleep(0.3)
        assert "incident [error] hang at step 6: hang title" in out.getvalue()   # before the run ends
        append(r.paths.incidents, incident(r.t + 2, "hang", 6, status="closed"))
        append(r.paths.incidents, incident(r.t + 3, "stall", 7, severity="warn")
               + incident(r.t + 4, "stall", 7, status="closed", severity="warn"))
        time.sleep(0.3)
        r.event("run_end", step=5, status="completed", reason="max_steps reached")
        r.flush()
        r.status("completed", exit_code=0, ended=r.t)
    assert result == ["completed"]
    lines = out.getvalue().splitlines()
    inc = [ln for ln in lines if ln.startswith("incident")]
    assert inc == ["incident [warn] loss_spike at step 5: Loss spike",
                   "incident [error] hang at step 6: hang title",
                   "incident closed: hang at step 6: hang title",
                   "incident [warn] stall at step 7: stall title",
                   "incident closed: stall at step 7: stall title"], lines


def test_once_lists_closed_incidents_too(tmp_path: Path) -> None:
    r = finished_run(tmp_path, steps=10)
    r.paths.incidents.write_text(incident(r.t, "stall", 4, severity="warn") + incident(r.t, "hang", 6)
                                 + incident(r.t + 1, "stall", 4, status="closed", severity="warn"))
    text = format_summary(load_run_state(tmp_path), now=r.t)
    assert "incidents: 1 open, 1 closed" in text
    assert "  closed [warn] stall at step 4: stall title" in text
    assert "  open   [error] hang at step 6: hang title" in text


def failed_by_rank1(tmp_path: Path) -> SynthRun:
    """Rank 1 raised; rank 0 lost its peer and wrote run_end (and so status.json's reason)."""
    r = SynthRun(tmp_path, max_steps=20)
    r.run_start()
    for s in range(1, 12):
        r.step(s)
    r.event("run_end", step=11, status="failed", reason=PEER)
    r.flush()
    r.paths.incidents.write_text(incident(r.t + 1, "crash", 12, evidence={"rank": 1, "line": CRASH}))
    r.status("failed", reason=PEER, exit_code=1, ended=r.t + 1)
    return r


def test_the_end_line_names_the_first_rank_that_failed(tmp_path: Path) -> None:
    r = failed_by_rank1(tmp_path)
    out = io.StringIO()
    assert follow_run(tmp_path, out, poll_s=0.01) == "failed"
    text = out.getvalue()
    assert f"run ended at step 11: failed (rank 1: {CRASH})" in text
    assert f"run failed (rank 1: {CRASH}): {tmp_path}" in text
    assert "Connection closed by peer" not in text
    st = load_run_state(tmp_path)
    assert st.failing_rank() == 1 and st.first_failure() == f"rank 1: {CRASH}"
    assert f"reason: rank 1: {CRASH}" in format_summary(st, now=r.t)


def test_without_an_exit_incident_the_reason_stays(tmp_path: Path) -> None:
    r = SynthRun(tmp_path)
    r.run_start()
    r.step(1)
    r.event("run_end", step=1, status="failed", reason="worker exited 1")
    r.flush()
    r.status("failed", reason="rank 1 exited with code 1", exit_code=1, ended=r.t)
    out = io.StringIO()
    assert follow_run(tmp_path, out, poll_s=0.01) == "failed"
    assert f"run failed (rank 1 exited with code 1): {tmp_path}" in out.getvalue()


def test_resume_prints_only_the_new_attempt(tmp_path: Path) -> None:
    r = failed_by_rank1(tmp_path)
    since = (r.paths.events.stat().st_size, r.t + 5)
    r.t += 10
    r.run_start(attempt=2, start_step=8)
    for s in range(9, 21):
        r.step(s)
    r.event("run_end", step=20, status="completed", reason="max_steps reached")
    r.flush()
    r.status("completed", attempt=2, exit_code=0, ended=r.t)
    out = io.StringIO()
    assert follow_run(tmp_path, out, poll_s=0.01, since=since) == "completed"
    lines = out.getvalue().splitlines()
    assert lines[0] == "attempt 2 started: world 2 x cpu, 800,000 params, resuming from step 8", lines
    assert not any("failed" in ln or "attempt 1" in ln or "crash" in ln for ln in lines), lines
    assert "run ended at step 20: completed (max_steps reached)" in lines


def test_every_zero_prints_each_logged_step(tmp_path: Path) -> None:
    finished_run(tmp_path, steps=10)
    out = io.StringIO()
    assert follow_run(tmp_path, out, min_interval_s=0, poll_s=0.01) == "completed"
    steps = [ln.split()[1] for ln in out.getvalue().splitlines() if ln.startswith("step ")]
    assert steps == [f"{s}/10" for s in range(1, 11)]
    out = io.StringIO()         # the default rate limit: one poll, one step line
    assert follow_run(tmp_path, out, poll_s=0.01) == "completed"
    assert [ln for ln in out.getvalue().splitlines() if ln.startswith("step ")] == [
        next(ln for ln in out.getvalue().splitlines() if ln.startswith("step 10/10"))]


def test_every_is_a_flag_of_each_headless_command(tmp_path: Path) -> None:
    for cmd in ("launch", "watch", "resume"):
        res = mt(cmd, "--help")
        assert res.returncode == 0 and "--every SECONDS" in res.stdout, res.stdout
    finished_run(tmp_path / "run", steps=10)
    res = mt("watch", tmp_path / "run", "--headless", "--every", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert len([ln for ln in res.stdout.splitlines() if ln.startswith("step ")]) == 10
    assert mt("watch", tmp_path / "run", "--headless", "--every", "-1").returncode == 2


def test_every_where_no_step_line_would_print_is_refused_not_dropped(tmp_path: Path) -> None:
    """#34 item 9: an option is never silently dropped; --every paces step lines, and these print none."""
    finished_run(tmp_path / "run", steps=3)
    preset = tmp_path / "p.toml"
    preset.write_text('[run]\nname = "e"\n[train]\nmax_steps = 2\n')
    for args in (["watch", tmp_path / "run", "--once", "--every", "5"],
                 ["watch", tmp_path / "run", tmp_path / "run", "--headless", "--every", "5"],
                 ["launch", preset, "--detach", "--every", "5", "--runs-dir", tmp_path / "runs"],
                 ["launch", preset, "--slurm", "--dry-run", "--every", "5", "--runs-dir", tmp_path / "runs"]):
        res = mt(*args)
        assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, (args, res.stdout, res.stderr)
        assert "--every: only with --headless" in res.stderr, (args, res.stderr)
    assert not (tmp_path / "runs").exists()   # refused before anything was made
    res = mt("watch", tmp_path / "run", "--once")   # not given: nothing to refuse
    assert res.returncode == 0, res.stderr


def test_a_checkpoints_write_time_shows_what_the_loop_waited(tmp_path: Path) -> None:
    r = SynthRun(tmp_path, max_steps=4)
    r.run_start()
    r.step(1)
    r.event("checkpoint", step=1, path="checkpoints/step-1", bytes=10, seconds=0.94, blocking_s=0.18, reason="interval", request_id=None)
    r.flush()
    assert "checkpoint: step 1 (0s ago; 0.94 s, loop waited 0.18 s)" in format_summary(load_run_state(tmp_path), now=r.t)
    ev = parse_event(dict(v=1, t=r.t, kind="checkpoint", step=1, path="p", bytes=1, seconds=0.5, blocking_s=0.5, reason="final", request_id=None))
    assert event_line(ev) == "checkpoint saved at step 1 (final in 0.50 s): p"  # blocking: the loop waited for all of it


def test_a_run_that_ended_before_its_first_step_says_so(tmp_path: Path) -> None:
    r = SynthRun(tmp_path, max_steps=10)
    r.event("run_end", step=0, status="failed", reason="model factory failed: ValueError: boom")
    r.flush()
    r.paths.incidents.write_text(incident(r.t + 1, "crash", None, evidence={"rank": 0, "line": "ValueError: boom"}))
    r.status("failed", reason="model factory failed", exit_code=2, ended=r.t + 1)
    out = io.StringIO()
    assert follow_run(tmp_path, out, poll_s=0.01) == "failed"
    text = out.getvalue()
    assert "run ended before the first step: failed (rank 0: ValueError: boom)" in text, text
    assert "incident [error] crash before the first step: crash title" in text, text
    assert "crash before the first step: crash title" in format_summary(load_run_state(tmp_path), now=r.t)


def test_mt_ckpt_and_mt_stop_name_a_saved_checkpoint_in_one_line(tmp_path: Path) -> None:
    """`mt ckpt` (the engine's answer) and `mt stop` (the run's newest checkpoint) share checkpoint_line."""
    from mt.contract.records import Checkpoint
    from tui.report.runs import answer_line, last_checkpoint_line
    from tui.state.answers import ControlAnswer

    finished_run(tmp_path, steps=100)
    newest = load_run_state(tmp_path).last_checkpoint
    ck = parse_event(dumps(dict(v=1, t=1_800_000_000.0, kind="checkpoint", step=newest.step, path=newest.path, bytes=1,
                                seconds=0.1, reason="request", request_id="r1")))
    assert isinstance(ck, Checkpoint)
    assert answer_line(ControlAnswer("r1", "checkpoint", "done", checkpoint=ck)) == last_checkpoint_line(tmp_path) \
        == f"checkpoint saved at step {newest.step}: {newest.path}"
    assert answer_line(ControlAnswer("r2", "checkpoint", "rejected", "no room")) == "checkpoint rejected: no room"


def _resumed_from_8(tmp_path: Path, checkpoint_at_8: bool) -> tuple[SynthRun, tuple[int, float]]:
    """Attempt 1 logged steps 1..11 (a checkpoint at 8 or not) and was killed; attempt 2 resumed at step 8, no step yet."""
    r = SynthRun(tmp_path, max_steps=20)
    r.run_start()
    for s in range(1, 12):
        r.step(s)
        if s == 8 and checkpoint_at_8:
            r.event("checkpoint", step=8, path="ckpt/step8", bytes=10, seconds=0.1, reason="interval", request_id=None)
    r.flush()
    since = (r.paths.events.stat().st_size, r.t + 5)
    r.t += 10
    r.run_start(attempt=2, start_step=8)
    r.flush()
    r.status("running", attempt=2)
    return r, since


def test_the_resume_line_prints_the_loss_logged_at_the_checkpoints_step(tmp_path: Path) -> None:
    for with_ckpt, loss in ((True, f"{loss_at(8):.4f}"), (False, "N/A")):
        root = tmp_path / str(with_ckpt)
        r, since = _resumed_from_8(root, with_ckpt)
        out = io.StringIO()
        result: list[str] = []
        th = threading.Thread(target=lambda: result.append(follow_run(root, out, poll_s=0.02, since=since)))
        th.start()
        deadline = time.monotonic() + 10
        while "step  8/20" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        complete(r, 8)
        r.status("completed", attempt=2, exit_code=0, ended=r.t)
        th.join(timeout=10)
        line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("step  8/20"))
        assert f"loss {loss} " in line, (with_ckpt, line, f"{loss_at(11):.4f} is step 11's")
