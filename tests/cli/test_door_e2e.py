"""Issue #34's symptoms, end to end: a FIFO or a /dev/zero link in a run directory hangs no reader
(the supervisor, `mt stop`, `mt watch --once`) and grows no memory, because every read goes
through the one door (mt/contract/door.py)."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from mt.contract import door
from mt.contract.paths import RunPaths
from tests.cli.conftest import MT, REPO, end_run, events, mt, run_cmd, wait_for, write_preset
from tests.tui.synth import SynthRun
from tui.stacks.nodes import nodes_verdict, pending_requests, request_stacks

SLOW_1 = {"train": {"max_steps": 3000}, "checkpoint": {"every_steps": 0}, "faults": {"step_sleep_s": 0.1},
          "launch": {"nproc_per_node": 1}}
RSS_BOUND = 1 << 30          # a supervisor holds tens of MB; reading /dev/zero took it to 16 GB
WATCH_AS = 4 << 30           # address space for `mt watch` (no torch): a runaway read fails instead of eating the host


def _status(run_dir: Path) -> dict[str, Any]:
    """status.json read the way the product does (a test's plain read would hang on a FIFO too)."""
    got = door.read_json(run_dir / "status.json")
    return got if isinstance(got, dict) else {}


def _replace(path: Path, how: str) -> None:
    """Put a FIFO or a link to /dev/zero where a run-directory file was."""
    path.unlink(missing_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn()'s value, failing the test if it has not returned after `seconds` (a blocked read)."""
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert got, f"still blocked after {seconds:.0f} s"
    return got[0]


def test_stack_requests_and_verdicts_that_are_fifos_or_dev_zero_are_skipped(tmp_path: Path) -> None:
    """A job's supervisors read control/.stacks/ and each node's verdict.json: junk there is passed over at once."""
    run = tmp_path / "job"
    for node in ("n1", "n2"):
        (run / "nodes" / node / "stacks").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    since = time.time() - 1
    rid = request_stacks(run)
    box = RunPaths(run).stack_requests
    os.mkfifo(box / "99991231T235959Z-fifo.json")   # named later than any floor: it is read
    (box / "99991231T235959Z-zero.json").symlink_to("/dev/zero")
    got = _within(10, lambda: pending_requests(RunPaths(run, "n1"), since))
    assert [r.id for r in got] == [rid]
    for node, how in (("n1", "fifo"), ("n2", "zero")):
        folder = RunPaths(run, node).stacks / f"20260101T000000Z-request-{rid}"
        folder.mkdir()
        _replace(folder / "verdict.json", how)
    found = _within(10, lambda: nodes_verdict(run, rid))
    assert sorted(found.silent) == ["n1", "n2"]


def _synth_run(root: Path) -> Path:
    r = SynthRun(root, name="door", max_steps=10)
    r.run_start()
    for s in range(1, 7):
        r.step(s, loss=3.0 - s * 0.1)
    r.event("run_end", step=6, status="stopped", reason="stop")
    r.flush()
    r.status("stopped", exit_code=0, reason="stop", ended=r.t)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fifo", "dev_zero"])
@pytest.mark.parametrize("name", ["status.json", "events.jsonl", "config.json"])
def test_watch_once_returns_on_a_fifo_or_dev_zero(tmp_path: Path, name: str, how: str) -> None:
    """`mt watch --once` on a run whose status.json, events.jsonl or config.json is a FIFO or a
    /dev/zero link: at once, no traceback, the summary (exit 0) or one line naming the file (exit 2)."""
    run_dir = _synth_run(tmp_path / "runs" / "door")
    _replace(run_dir / name, "fifo" if how == "fifo" else "zero")
    cmd = ["prlimit", f"--as={WATCH_AS}", "--", *MT, "watch", str(run_dir), "--once"]
    res = run_cmd(cmd, 60, cwd=REPO, env={"PYTHONUNBUFFERED": "1"})
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr, res.stderr
    if res.returncode == 2:
        assert len(res.stderr.strip().splitlines()) == 1 and name in res.stderr, res.stderr
    else:
        assert res.returncode == 0 and "door" in res.stdout, res.stdout + res.stderr


@pytest.mark.slow
def test_a_fifo_in_a_live_run_blocks_neither_its_supervisor_nor_watch_nor_stop(tmp_path: Path, runs: Path) -> None:
    """system.jsonl (the supervisor appends a sample each tick, `mt watch` tails it) and a stack
    request made FIFOs while the run trains: `mt watch --once` returns, `mt stop` is recorded."""
    preset = write_preset(tmp_path / "p.toml", runs, **SLOW_1)
    res = mt("launch", preset, "--detach")
    assert res.returncode == 0, res.stderr
    run_dir = Path(res.stdout.strip())
    try:
        wait_for(lambda: events(run_dir, "step"), 180, "the first step")
        system = run_dir / "system.jsonl"
        wait_for(lambda: door.size_of(system) > 0, 60, "the supervisor's first system sample")
        _replace(system, "fifo")
        stacks = RunPaths(run_dir).stack_requests
        stacks.mkdir(parents=True, exist_ok=True)
        os.mkfifo(stacks / "99991231T235959Z-fifo.json")
        n = len(events(run_dir, "step"))
        wait_for(lambda: len(events(run_dir, "step")) > n + 2, 60, "steps after the FIFOs")   # ticks went by

        once = mt("watch", run_dir, "--once", timeout=60)
        assert once.returncode == 0 and "[running]" in once.stdout, once.stdout + once.stderr
        stop = mt("stop", run_dir, "--timeout", "120", timeout=180)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert _status(run_dir)["state"] == "stopped"
        assert events(run_dir, "run_end")[-1]["status"] == "stopped"
        log = door.read_text(run_dir / "logs" / "supervisor.log", 64 << 20)
        assert log.count("cannot write system.jsonl") == 1 and "a FIFO, not a regular file" in log, log[-4000:]
    finally:
        end_run(run_dir)


class _RssWatch:
    """Samples the RSS of a run's supervisors every 50 ms; one over the bound is killed at once
    (the test then fails on it) so a runaway read cannot take the host's memory."""

    def __init__(self, run_dir: Path, bound: int) -> None:
        self.run_dir, self.bound = str(run_dir), bound
        self.peak = 0
        self.killed: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _supervisors(self) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "tui.supervise.supervisor_main" in cmd and self.run_dir in cmd:
                out.append(p)
        return out

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            for p in self._supervisors():
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                self.peak = max(self.peak, rss)
                if rss > self.bound:
                    p.kill()
                    self.killed.append(p.pid)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.mark.slow
def test_a_dev_zero_mirror_json_keeps_the_supervisor_small(tmp_path: Path, runs: Path) -> None:
    """mirror.json (read when the supervisor opens its TensorBoard mirror) a link to /dev/zero at
    `mt resume`: the supervisor stays far under 1 GB, mirrors afresh, and the run trains and stops."""
    preset = write_preset(tmp_path / "p.toml", runs, **SLOW_1, monitor={"tensorboard": "tb"})
    res = mt("launch", preset, "--detach")
    assert res.returncode == 0, res.stderr
    run_dir = Path(res.stdout.strip())
    watch = _RssWatch(run_dir, RSS_BOUND)
    try:
        wait_for(lambda: door.is_regular(run_dir / "mirror.json"), 180, "the mirror's mirror.json")
        assert mt("stop", run_dir, "--timeout", "120", timeout=180).returncode == 0
        _replace(run_dir / "mirror.json", "zero")
        resumed = mt("resume", run_dir, "--detach")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        wait_for(lambda: watch.killed or _stepped_in(run_dir, 2), 180, "attempt 2 stepping")
        assert not watch.killed, f"the supervisor passed {RSS_BOUND >> 20} MiB (peak {watch.peak >> 20} MiB)"
        wait_for(lambda: door.is_regular(run_dir / "mirror.json"), 60, "mirror.json written afresh")
        stop = mt("stop", run_dir, "--timeout", "120", timeout=180)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert _status(run_dir)["state"] == "stopped"
        print(f"supervisor peak RSS {watch.peak >> 20} MiB")
        assert watch.peak < RSS_BOUND // 4 and not watch.killed, f"peak {watch.peak >> 20} MiB"
    finally:
        watch.close()
        end_run(run_dir)


def _stepped_in(run_dir: Path, attempt: int) -> bool:
    """A step logged after attempt `attempt`'s run_start."""
    evs = events(run_dir)
    starts = [i for i, e in enumerate(evs) if e.get("kind") == "run_start" and e.get("attempt") == attempt]
    return bool(starts) and any(e.get("kind") == "step" for e in evs[starts[0]:])
