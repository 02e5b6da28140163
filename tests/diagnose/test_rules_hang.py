"""hang and straggler from heartbeats and rank processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mt.contract.config import MonitorConfig
from tui.diagnose.hang import CONFIRM_S, EARLY_FLOOR_S

from .fakerun import FakeRun, dead_pid


def warm(run: FakeRun, n: int = 30, step_time: float = 0.3) -> None:
    run.start()
    for _ in range(n):
        run.do_step(step_time=step_time)


def test_hang_fires_after_the_floor_when_no_rank_stands_out(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=10.0)
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run)
    t_last = run.now
    run.idle(m.hang_floor_s + 5)  # every heartbeat at the same step, every "rank" the same process
    (inc,) = run.opened("hang")
    assert m.hang_floor_s <= inc["t"] - t_last <= m.hang_floor_s + 1.0
    assert inc["evidence"]["early"] is False and inc["evidence"]["suspect_ranks"] == []


def test_hang_is_named_early_when_a_rank_is_behind(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=10.0)
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run)
    last = run.step
    t_last = run.now
    run.heartbeat(0, last + 1)  # rank 0 finished the next step; rank 1 never did
    run.idle(m.hang_floor_s + 5)
    got = run.opened("hang")
    assert len(got) == 1
    inc = got[0]
    assert inc["step"] == last + 1 and inc["severity"] == "error"
    early = m.hang_step_factor * 0.3   # factor x the run's own median step interval (over the 3 s floor)
    assert early + CONFIRM_S <= inc["t"] - t_last <= early + CONFIRM_S + 1.0, inc["t"] - t_last
    assert inc["evidence"]["early"] is True and "named early" in inc["detail"]
    ev = inc["evidence"]
    assert ev["suspect_ranks"] == [1]
    assert set(ev["ranks"]) == {"0", "1"} and ev["ranks"]["1"]["heartbeat_step"] == last
    assert "rank 1" in inc["detail"]
    # steps resume: the hang closes after close_after_s
    for _ in range(int(m.close_after_s / 0.3) + 5):
        run.do_step(step_time=0.3)
    assert [r["code"] for r in run.closed()] == ["hang"]


def test_hang_limit_scales_with_step_time(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=5.0, hang_step_factor=10.0)
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 20, step_time=2.0)
    run.idle(2.0 * m.hang_step_factor - 2)
    assert run.opened("hang") == []
    run.idle(4)
    assert len(run.opened("hang")) == 1


def test_no_hang_when_processes_are_gone(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=5.0)
    run = FakeRun(tmp_path / "r", monitor=m)
    run.pids = {0: dead_pid(), 1: dead_pid()}
    warm(run, 10)
    run.idle(30)
    assert run.opened("hang") == []


def test_no_hang_during_a_long_checkpoint_or_eval(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=10.0)
    run = FakeRun(tmp_path / "r", monitor=m, eval_every=20, checkpoint_every=30)
    warm(run, 20)
    run.idle(m.hang_floor_s * 1.8)  # the first eval: longer than the floor, within the allowance
    run.event("eval", step=run.step, val_loss=2.0)
    for _ in range(10):
        run.do_step(step_time=0.3)
    run.idle(m.hang_floor_s * 1.8)  # first checkpoint
    run.event("checkpoint", step=run.step, path="x", bytes=1, seconds=18.0, reason="interval", request_id=None)
    for _ in range(30):
        run.do_step(step_time=0.3)
    assert run.records == []


def test_checkpoint_after_eval_at_the_same_step_still_gets_its_time(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=10.0)
    run = FakeRun(tmp_path / "r", monitor=m, eval_every=20, checkpoint_every=20)
    warm(run, 20)
    run.idle(2)
    run.event("eval", step=run.step, val_loss=2.0)  # the eval is done; the checkpoint is not
    run.idle(m.hang_floor_s * 1.8)
    run.event("checkpoint", step=run.step, path="x", bytes=1, seconds=18.0, reason="interval", request_id=None)
    for _ in range(10):
        run.do_step(step_time=0.3)
    assert run.records == []


def test_requested_checkpoint_is_a_pause_not_a_hang(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=10.0)
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 23)
    run.event("control", request_id="r1", action="checkpoint", status="accepted", detail="")
    run.do_step(step_time=0.3)
    run.idle(m.hang_floor_s * 1.8)
    run.event("checkpoint", step=run.step, path="x", bytes=1, seconds=18.0, reason="request", request_id="r1")
    for _ in range(5):
        run.do_step(step_time=0.3)
    assert run.records == []


def test_big_model_first_checkpoint_gets_time_by_its_size(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m, checkpoint_every=50)
    run.start(params_total=7_000_000_000)  # ~112 GB of weights and optimizer state
    for _ in range(50):
        run.do_step(step_time=0.3)
    run.idle(300, every=5.0)
    assert run.records == []
    # once written, the next quiet spell is judged at the normal limit again
    run.event("checkpoint", step=run.step, path="x", bytes=1, seconds=300.0, reason="interval", request_id=None)
    run.idle(m.hang_floor_s + 2)
    assert [r["code"] for r in run.opened()] == ["hang"]


def test_no_hang_while_a_new_attempt_starts(tmp_path: Path) -> None:
    m = MonitorConfig(hang_floor_s=5.0)
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 10)
    run.status({"state": "starting", "attempt": 2, "exit_code": None})
    run.idle(20)
    run.status({"state": "running", "attempt": 2, "exit_code": None})
    run.idle(8)  # torch imports; attempt 1's events are older than the floor
    assert run.opened("hang") == []


def test_straggler_rank_steadily_behind(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 10, step_time=0.5)
    lag = m.straggler_steps + 1
    for _ in range(12):
        run.heartbeat(1, run.step + 1 - lag)
        run.do_step(step_time=0.5, beats=(0,))
    got = run.opened("straggler")
    assert len(got) == 1
    assert got[0]["evidence"]["lag_steps"] == {"1": lag}
    assert "rank 1" in got[0]["title"]


def test_brief_lag_is_no_straggler(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 10, step_time=0.5)
    run.do_step(step_time=0.5, beats=(0,))
    run.heartbeat(1, run.step - m.straggler_steps - 1)
    for _ in range(10):
        run.do_step(step_time=0.5)
    assert run.records == []


def test_a_nested_heartbeat_file_costs_only_its_own_reading(tmp_path: Path) -> None:
    """heartbeat/rank9 nested past json's recursion limit (and one with an infinite step): the
    monitor still polls and names the SIGSTOPped rank 1 as the hang's suspect."""
    m = MonitorConfig(hang_floor_s=10.0)
    # real ranks, not this test's process: under pytest-xdist it has children of its own, which the
    # stall rule would take for busy DataLoader workers and call the quiet spell the input pipeline's
    waiter, stopped = _ranks(tmp_path)
    try:
        run = FakeRun(tmp_path / "r", monitor=m)
        run.pids[0], run.pids[1] = waiter.pid, stopped.pid
        warm(run)
        run.paths.heartbeat(9).write_text("[" * 100_000 + "]" * 100_000)
        run.paths.heartbeat(8).write_text('{"step": 1e999, "t": 1e999, "pid": 1}')
        os.kill(stopped.pid, signal.SIGSTOP)
        while psutil.Process(stopped.pid).status() != psutil.STATUS_STOPPED:   # a signal lands when the kernel says
            time.sleep(0.01)
        run.heartbeat(0, run.step + 1)  # rank 0 went on; the stopped rank 1 did not
        run.idle(m.hang_floor_s + 5)
        (inc,) = run.opened("hang")
        assert inc["evidence"]["suspect_ranks"] == [1] and "rank 1" in inc["detail"]
        assert inc["evidence"]["ranks"]["1"]["state"] == "T"   # /proc says stopped: it is the real process
        assert set(inc["evidence"]["ranks"]) == {"0", "1"}     # the bad files named no rank
    finally:
        _end(waiter, stopped)


def _ranks(tmp_path: Path) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Two real processes: one waiting in read() as a rank in a collective does, one asleep in its own code."""
    waiter = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nprint('ready', flush=True)\nwhile True: time.sleep(1)"],
                               stdout=subprocess.PIPE, text=True)
    for p in (waiter, sleeper):
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return waiter, sleeper


def _end(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def test_a_rank_asleep_while_the_other_waits_is_a_hang_within_seconds(tmp_path: Path) -> None:
    m = MonitorConfig()   # the 30 s floor stays the fallback
    waiter, sleeper = _ranks(tmp_path)
    try:
        run = FakeRun(tmp_path / "r", monitor=m)
        run.pids = {0: waiter.pid, 1: sleeper.pid}
        warm(run, 40, step_time=0.1)
        t_last = run.now
        run.idle(12)
        (inc,) = run.opened("hang")
        assert inc["evidence"]["suspect_ranks"] == [1] and inc["evidence"]["early"] is True, inc
        assert inc["t"] - t_last <= EARLY_FLOOR_S + CONFIRM_S + 1.0, inc["t"] - t_last
        assert "rank 1 looks stuck (it is in clock_nanosleep while rank 0 waits for a peer" in inc["detail"], inc["detail"]
    finally:
        _end(waiter, sleeper)


def test_a_checkpoint_is_given_its_measured_time_before_an_early_verdict(tmp_path: Path) -> None:
    m = MonitorConfig()
    waiter, sleeper = _ranks(tmp_path)   # rank 1 "writes" while rank 0 waits in the barrier: a checkpoint looks so
    try:
        run = FakeRun(tmp_path / "r", monitor=m, checkpoint_every=40)
        run.pids = {0: waiter.pid, 1: sleeper.pid}
        warm(run, 40, step_time=0.1)
        run.idle(8)   # the first checkpoint: never measured, only the floor (and its estimate) decides
        assert run.opened("hang") == []
        run.event("checkpoint", step=run.step, path="x", bytes=1, seconds=8.0, reason="interval", request_id=None)
        for _ in range(40):
            run.do_step(step_time=0.1)
        t_last = run.now
        run.idle(40)  # the next one never ends: 3x the measured 8 s, then named
        (inc,) = run.opened("hang")
        assert inc["evidence"]["early"] is True and inc["evidence"]["suspect_ranks"] == [1], inc
        assert EARLY_FLOOR_S + 3 * 8.0 <= inc["t"] - t_last <= EARLY_FLOOR_S + 3 * 8.0 + CONFIRM_S + 1.0, inc["t"] - t_last
    finally:
        _end(waiter, sleeper)


def test_a_script_that_saved_slowly_before_gets_that_time_at_any_step(tmp_path: Path) -> None:
    # a script's rank 1 saves (rank 0 waits in its barrier) whenever the script decides: no config says when
    waiter, sleeper = _ranks(tmp_path)
    try:
        run = FakeRun(tmp_path / "r", monitor=MonitorConfig(), script="train.py")
        run.pids = {0: waiter.pid, 1: sleeper.pid}
        warm(run, 20, step_time=0.1)
        run.idle(6)   # its first save: rank 1 busy, rank 0 waiting, nothing measured yet
        assert [r["code"] for r in run.opened()] == ["hang"]   # a first slow save looks like a hang
        run.event("checkpoint", step=run.step, path="x", bytes=1, seconds=6.0, reason="script", request_id=None)
        for _ in range(40):
            run.do_step(step_time=0.1)
        t_last = run.now
        run.idle(3 * 6.0)   # its next save, at a step of its choosing: 3x the 6 s it took
        assert len(run.opened("hang")) == 1
        run.idle(EARLY_FLOOR_S + CONFIRM_S + 1.0)
        assert len(run.opened("hang")) == 2 and run.opened("hang")[1]["t"] - t_last > 3 * 6.0
    finally:
        _end(waiter, sleeper)


def _spinner() -> subprocess.Popen[str]:
    """A real process busy on its CPU, as a rank waiting in an NCCL collective is (it spins in cudaStreamSynchronize)."""
    p = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True)\nwhile True: pass"], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_on_a_cuda_run_the_spinning_rank_is_not_blamed_the_stacks_decide(tmp_path: Path) -> None:
    # rank 0 waits in NCCL (spins: "running" in /proc), rank 1 is the stuck one (blocked in read): on a CUDA
    # run the system calls name no one; the stacks' verdict, once captured, names rank 1, and so does the timeout
    from .test_rules_exit import NCCL_WATCHDOG, TORCHRUN_REPORT, TRACEBACK
    m = MonitorConfig()
    stuck, sleeper = _ranks(tmp_path)
    spinner = _spinner()
    try:
        run = FakeRun(tmp_path / "r", monitor=m)
        run.pids = {0: spinner.pid, 1: stuck.pid}
        run.start(backend="nccl", device="NVIDIA H100 80GB HBM3")
        for _ in range(30):
            run.do_step(step_time=0.3)
        t_last = run.now
        run.idle(m.hang_floor_s + 3)
        (inc,) = run.opened("hang")
        assert inc["evidence"]["suspect_ranks"] == [] and inc["evidence"]["early"] is False, inc
        assert inc["t"] - t_last >= m.hang_floor_s, "named early from the system calls"
        assert inc["evidence"]["ranks"]["0"]["syscall"] == "running" and inc["evidence"]["nccl"] is True
        assert "NCCL collective spins" in inc["detail"], inc["detail"]
        # the capture's verdict (tui/stacks/auto.py writes it as an update of the open hang)
        run.monitor.update("hang", {"verdict": "rank 1 is in `read_batch` (train.py:40); rank 0 waits in `all_reduce` (train.py:52)",
                                    "groups": [{"ranks": [1], "func": "read_batch", "where": "train.py:40", "waits_in": None},
                                               {"ranks": [0], "func": "step", "where": "train.py:52", "waits_in": "all_reduce"}]},
                           "stacks captured", now=run.now)
        (run.paths.logs / "torchrun.log").write_text(TORCHRUN_REPORT.format(root=0, other=1, code=1))
        run.paths.rank_log(0).write_text("step 1\n" + TRACEBACK.format(r=0, last=NCCL_WATCHDOG))
        run.status({"state": "running", "attempt": 1, "exit_code": 1, "reason": "a worker exited"})
        run.poll()
        (timeout,) = run.opened("nccl_timeout")
        assert "rank 1 had stopped" in timeout["title"], timeout["title"]
    finally:
        _end(stuck, sleeper, spinner)
