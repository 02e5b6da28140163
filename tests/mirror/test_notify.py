"""[monitor] notify: apprise's json:// URL against a real local HTTP receiver (tests/mirror/receiver.py).

The supervisor's hook over a run directory written by hand (rate limit, rollbacks, the end), then real
runs: a planted NaN notifies with its diagnosis and the run's end; a receiver that never answers slows
neither the run nor the supervisor's ticks; a bad URL, or no apprise, is one line at launch (exit 2)."""
from __future__ import annotations

import json
import logging
import socket
import statistics
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from mt.contract.config import Config, MonitorConfig, RunConfig
from mt.contract.records import parse_event
from mt.contract.status import FINAL_STATES, read_status
from tests.cli.conftest import events, mt, run_dir_from, status, wait_for, write_preset
from tests.mirror.receiver import Got, Receiver, receiver
from tests.tui.synth import SynthRun
from tui.cli import app
from tui.mirror.notify import NotifyHook
from tui.mirror.sender import CLOSE_WAIT_S

pytest.importorskip("apprise")


def _incident(root: Path, code: str, t: float, state: str = "open", severity: str = "warn") -> None:
    line = {"v": 1, "t": t, "code": code, "severity": severity, "step": 3, "title": f"{code} title",
            "detail": f"{code} detail", "advice": f"{code} advice", "evidence": {"rank": 1, "node": "n1"},
            "status": state, "source": "supervisor"}
    with open(root / "incidents.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def _hook(root: Path, url: str, log: logging.Logger | None = None, **monitor: object) -> NotifyHook:
    cfg = Config(run=RunConfig(name="synth"), monitor=MonitorConfig(notify=[url], **monitor))  # type: ignore[arg-type]
    return NotifyHook(SynthRun(root).paths, cfg, log or logging.getLogger("test-notify"))


class Lines(logging.Handler):
    """The records a logger got, as text."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _wait_got(rec: Receiver, n: int, what: str, timeout: float = 30) -> list[Got]:
    return wait_for(lambda: len(rec.received()) >= n and rec.received(), timeout, what)


def test_rate_limit_rollbacks_and_the_end(tmp_path: Path) -> None:
    """One per kind per notify_repeat_s, notify_per_minute in all; what was held back is counted in
    the next notification that goes (the end always goes); a user's rollback is not told of."""
    root = tmp_path / "run"
    run = SynthRun(root, max_steps=10)
    run.run_start()
    for s in range(1, 6):
        run.step(s, loss=float(10 - s))
    run.flush()
    _incident(root, "stale", time.time())   # filed before this supervisor: an earlier one's news
    with receiver() as rec:
        hook = _hook(root, rec.url(), notify_repeat_s=600, notify_per_minute=3)
        st = read_status(root)
        st.state = "running"
        now = time.time()
        for i in range(4):   # a flapping incident: opened and closed four times
            _incident(root, "throughput_drop", now + i)
            _incident(root, "throughput_drop", now + i, state="closed")
        _incident(root, "clip_active", now, severity="info")   # below notify_severity (warn)
        hook.poll(st, [])
        rollbacks = [parse_event({"v": 1, "t": now, "kind": "rollback", "step": 40, "to_step": 20, "skip_batches": 30,
                                  "lr_scale": 0.5, "why": "nan_loss at step 40", "by": by, "count": n})
                     for n, by in enumerate(("on_nan", "user", "on_spike", "on_nan"), 1)]
        hook.poll(st, rollbacks)
        got = _wait_got(rec, 3, "three notifications")
        st.state, st.reason, st.started, st.ended = "completed", "max_steps reached", now - 75, now
        hook.poll(st, [])
        hook.close()
        got = rec.received()
    assert [g.title for g in got] == ["mt run: throughput_drop title", "mt run: rolled back to step 20",
                                      "mt run: rolled back to step 20", "mt run: completed"], got
    first = got[0].message
    assert "[warn] throughput_drop at step 3 rank 1 on node n1" in first
    assert "throughput_drop detail" in first and "Advice: throughput_drop advice" in first
    assert "Rolled back by on_nan from step 40" in got[1].message and "rollback 1 of this run" in got[1].message
    assert "(the rate limit, or a slow service): throughput_drop x3." in got[1].message   # the repeats it held back
    assert "by on_spike" in got[2].message and "by user" not in "".join(g.message for g in got)
    end = got[3].message
    assert "completed (max_steps reached) after 1m15s, step 5/10" in end
    assert "final loss 5.0000, best loss 5.0000 @5" in end
    assert end.endswith("(the rate limit, or a slow service): rollback x1.")   # the fourth: over the minute's cap of 3
    assert got[0].payload["type"] == "warning" and got[3].payload["type"] == "success"


def test_a_failed_send_is_logged_never_raised(tmp_path: Path) -> None:
    """A service that refuses the connection: the tick returns at once, the failure is a log line with apprise's reason."""
    root = tmp_path / "run"
    SynthRun(root)
    with socket.socket() as s:   # a port nobody listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log, lines = logging.getLogger("test-notify-refused"), Lines()
    log.addHandler(lines)
    hook = _hook(root, f"json://127.0.0.1:{port}/mt", log)
    st = read_status(root)
    _incident(root, "crash", time.time(), severity="error")
    hook.poll(st, [])
    wait_for(lambda: any("failed" in line for line in lines.lines), 30, "the failure logged")
    hook.close()
    (failed,) = [line for line in lines.lines if "failed" in line]
    assert failed.startswith(f"WARNING notification crash to json://127.0.0.1:{port}/mt failed after ")
    assert "Connection error" in failed and " - WARNING - " not in failed, failed


@pytest.mark.parametrize("how", ["--detach", "--slurm"])
def test_a_bad_url_is_one_line_at_launch(tmp_path: Path, how: str) -> None:
    runs = tmp_path / "runs"
    preset = write_preset(tmp_path / "p.toml", runs, monitor={"notify": ["json://127.0.0.1:9/ok", "nosuch://x"]})
    result = CliRunner().invoke(app, ["launch", str(preset), how])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"mt: {preset}: monitor.notify[1]: 'nosuch://x' is not a URL apprise can send to "
        "(e.g. ntfy://topic, slack://..., mailto://..., json://host/path)"]
    assert not runs.exists()


@pytest.mark.slow
def test_without_apprise_a_notify_preset_names_the_extra(tmp_path: Path) -> None:
    """A real `mt launch` whose Python cannot import apprise (shadowed by a module that fails as a missing one)."""
    (tmp_path / "shadow").mkdir()
    (tmp_path / "shadow" / "apprise.py").write_text("raise ModuleNotFoundError(\"No module named 'apprise'\")\n")
    runs = tmp_path / "runs"
    preset = write_preset(tmp_path / "p.toml", runs, monitor={"notify": ["ntfy://topic"]})
    result = mt("launch", preset, "--detach", env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f'mt: {preset}: monitor.notify: needs the notify extra, which is not installed (pip install "mt[notify]")']
    assert not runs.exists()


@pytest.mark.slow
def test_a_nan_run_notifies_its_incident_and_its_end(tmp_path: Path) -> None:
    with receiver() as rec:
        preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", monitor={"notify": [rec.url()]},
                              faults={"nan_at_step": 6})
        done = mt("launch", preset, "--headless")
        assert done.returncode == 0, done.stdout + done.stderr
        run_dir = run_dir_from(done.stdout)
        got = _wait_got(rec, 2, "the incident and the end")
    (nan,) = [e for e in events(run_dir, "incident") if e["code"] == "nan_loss"]
    assert [g.title for g in got] == [f"mt {run_dir.name}: {nan['title']}", f"mt {run_dir.name}: completed"], got
    assert nan["advice"] in got[0].message and nan["detail"] in got[0].message
    assert got[0].payload["type"] == "warning"
    st = status(run_dir)
    losses = [e["loss"] for e in events(run_dir, "step") if isinstance(e["loss"], float)]
    assert f"final loss {losses[-1]:.4f}" in got[1].message and f"best loss {min(losses):.4f}" in got[1].message
    assert "step 24/24" in got[1].message and st["reason"] in got[1].message
    assert got[0].t - nan["t"] < 30 and got[1].t >= st["ended"]


@pytest.mark.slow
def test_a_receiver_that_never_answers_slows_nothing(tmp_path: Path) -> None:
    """Every notification hangs (apprise's read timeout raised to 60 s, past the run's end): the steps keep
    their pace, the supervisor keeps ticking (a system sample each second), and once the run is over it
    waits CLOSE_WAIT_S for the queue, logs what was not sent and exits."""
    with receiver(hang=True) as rec:
        preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", train={"max_steps": 60},
                              monitor={"notify": [rec.url() + "?rto=60"], "notify_repeat_s": 0, "notify_per_minute": 60},
                              faults={"nan_at_step": 6, "step_sleep_s": 0.15})
        started = mt("launch", preset, "--detach")
        assert started.returncode == 0, started.stderr
        run_dir = run_dir_from(started.stdout)
        first = _wait_got(rec, 1, "the first notification", timeout=120)[0]
        wait_for(lambda: status(run_dir).get("state") in FINAL_STATES, 240, "the run's end")
        supervisor = psutil.Process(status(run_dir)["supervisor_pid"])
        log = run_dir / "logs" / "supervisor.log"
        said = f"notifications not sent: the service did not answer within {CLOSE_WAIT_S:.0f} s"
        wait_for(lambda: said in log.read_text(), CLOSE_WAIT_S + 60, "the unsent notifications logged")
        wait_for(lambda: not supervisor.is_running() or supervisor.status() == psutil.STATUS_ZOMBIE, 60, "the supervisor's exit")
    steps = [e["t"] for e in events(run_dir, "step")]
    assert status(run_dir)["state"] == "completed" and len(steps) == 60
    assert len(rec.received()) == 1   # the one send still hanging when the supervisor left
    before = [b - a for a, b in zip(steps, steps[1:]) if b < first.t]
    after = [b - a for a, b in zip(steps, steps[1:]) if a > first.t]
    assert len(before) >= 3 and len(after) >= 10
    # the steps while the send hangs keep the pace the run had before it
    assert statistics.median(after) < 3 * statistics.median(before) + 0.2, (before, after)
    samples = [json.loads(line)["t"] for line in (run_dir / "system.jsonl").read_text().splitlines()]
    during = [b - a for a, b in zip(samples, samples[1:]) if a >= first.t]
    # the supervisor's tick, once a second, went on: one that waited on the send would stop for 60 s
    assert len(during) >= 3 and max(during) < 15, during
