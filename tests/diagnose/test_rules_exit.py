"""crash / oom / nccl_timeout: which rank died first, and why, from exit codes and log tails."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tui.diagnose.exit import classify_log
from tui.read.torchrun_log import torchrun_failures

from .fakerun import FakeRun, dead_pid

TORCHRUN_REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
engine FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_07:10:38
  host      : localhost
  rank      : {other} (local_rank: {other})
  exitcode  : -15 (pid: 4137)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4137
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_07:10:38
  host      : localhost
  rank      : {root} (local_rank: {root})
  exitcode  : {code} (pid: 4138)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

TRACEBACK = """\
[rank{r}]: Traceback (most recent call last):
[rank{r}]:   File "/work/main/engine/train.py", line 120, in train
[rank{r}]:     loss = step(batch)
[rank{r}]: {last}
"""
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB"
GLOO_TIMEOUT = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                "Timed out waiting 300000ms for recv operation to complete")
NCCL_WATCHDOG = ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, "
                 "NumelIn=1024, Timeout(ms)=600000) ran for 600046 milliseconds before timing out.")
PEER = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:29500")


def test_torchrun_report_root_cause_first() -> None:
    fails = torchrun_failures("noise\n" + TORCHRUN_REPORT.format(root=1, other=0, code=1) + "tail\n")
    assert [(f.rank, f.exit_code, f.pid) for f in fails] == [(1, 1, 4138), (0, -15, 4137)]
    # an older report earlier in the file (attempt 1) does not count
    two = TORCHRUN_REPORT.format(root=0, other=1, code=1) + TORCHRUN_REPORT.format(root=1, other=0, code=-9)
    assert torchrun_failures(two)[0].rank == 1 and torchrun_failures(two)[0].exit_code == -9
    assert torchrun_failures("no report here") == []


@pytest.mark.parametrize("line,kind", [
    (OOM, "oom"), (GLOO_TIMEOUT, "timeout"), (NCCL_WATCHDOG, "timeout"), (PEER, "peer"),
    ("RuntimeError: injected crash at step 40 on rank 1", "exception"),
    ("ValueError: bad shape", "exception"),
    ("RuntimeError: DataLoader worker (pid 21925) is killed by signal: Terminated. ", "terminated"),
    ("KeyboardInterrupt", "terminated"),
    ("RuntimeError: DataLoader worker (pid 812) is killed by signal: Killed. ", "killed"),
])
def test_classify_log(line: str, kind: str) -> None:
    got_kind, got_line = classify_log(TRACEBACK.format(r=1, last=line) + "\n")
    assert got_kind == kind
    assert got_line == line.strip()


def test_classify_log_without_traceback() -> None:
    assert classify_log("step 10 loss 2.3\nstep 11 loss 2.2\n") == (None, "")


def crashed_run(tmp_path: Path, root: int, code: int, logs: dict[int, str], host_mem: float = 0.3) -> FakeRun:
    run = FakeRun(tmp_path / "r")
    run.start()
    for _ in range(12):
        run.do_step(step_time=0.3)
    run.sample(host_mem_share=host_mem)
    (run.paths.logs / "torchrun.log").write_text(TORCHRUN_REPORT.format(root=root, other=1 - root, code=code))
    for r, text in logs.items():
        run.paths.rank_log(r).write_text("step 1\nstep 2\n" + text)
    run.status({"state": "running", "attempt": 1, "exit_code": 1, "reason": "a worker exited"})
    run.poll()
    return run


def test_crash_names_the_first_rank_and_its_exception(tmp_path: Path) -> None:
    line = "RuntimeError: injected crash at step 13 on rank 1"
    run = crashed_run(tmp_path, 1, 1, {1: TRACEBACK.format(r=1, last=line), 0: TRACEBACK.format(r=0, last=PEER)})
    got = run.opened()
    assert [g["code"] for g in got] == ["crash"]
    inc = got[0]
    assert inc["step"] == 13 and inc["severity"] == "error"
    assert inc["evidence"]["rank"] == 1 and inc["evidence"]["line"] == line
    assert "rank 1" in inc["detail"] and "first to fail" in inc["detail"]
    run.poll()  # still failed: not repeated
    assert len(run.opened()) == 1


def test_oom_from_the_log(tmp_path: Path) -> None:
    run = crashed_run(tmp_path, 0, 1, {0: TRACEBACK.format(r=0, last=OOM)})
    assert [(g["code"], g["evidence"]["rank"]) for g in run.opened()] == [("oom", 0)]
    assert "micro_batch_size" in run.opened()[0]["advice"]


# CUDA's own out-of-memory (outside torch's allocator), and NCCL's when its buffers do not fit
CUDA_ERROR_OOM = [
    "RuntimeError: CUDA error: out of memory",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]
NCCL_OOM = [
    "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
    "ncclUnhandledCudaError: Call to CUDA function failed.",
    "Last error:",
    "Cuda failure 'out of memory'",
]


@pytest.mark.parametrize("lines,line", [
    (CUDA_ERROR_OOM, "RuntimeError: CUDA error: out of memory"), (NCCL_OOM, "Cuda failure 'out of memory'"),
    ([*NCCL_OOM[:-1], "Cuda failure 2 'out of memory'"], "Cuda failure 2 'out of memory'"),
], ids=["cuda-error", "nccl", "nccl-numbered"])
def test_cuda_and_nccl_out_of_memory_in_a_workers_log_is_oom(tmp_path: Path, lines: list[str], line: str) -> None:
    log = TRACEBACK.format(r=1, last=lines[0]) + "".join(f"[rank1]: {ln}\n" for ln in lines[1:])
    run = crashed_run(tmp_path, 1, 1, {1: log, 0: TRACEBACK.format(r=0, last=PEER)})
    got = run.opened()
    assert [(g["code"], g["evidence"]["rank"], g["evidence"]["line"]) for g in got] == [("oom", 1, line)], got
    assert "micro_batch_size" in got[0]["advice"]


def test_sigkill_with_full_host_memory_is_the_oom_killer(tmp_path: Path) -> None:
    run = crashed_run(tmp_path, 1, -9, {1: "step 12\n"}, host_mem=0.97)
    got = run.opened()
    assert [(g["code"], g["evidence"]["signal"]) for g in got] == [("oom", "SIGKILL")]
    assert "OOM killer" in got[0]["detail"]


def test_sigkill_with_free_memory_is_a_crash(tmp_path: Path) -> None:
    run = crashed_run(tmp_path, 1, -9, {1: "step 12\n"}, host_mem=0.3)
    assert [(g["code"], g["evidence"]["signal"]) for g in run.opened()] == [("crash", "SIGKILL")]


def test_collective_timeout(tmp_path: Path) -> None:
    run = crashed_run(tmp_path, 0, 1, {0: TRACEBACK.format(r=0, last=GLOO_TIMEOUT)})
    assert [g["code"] for g in run.opened()] == ["nccl_timeout"]
    assert "rank 0 gave up waiting" in run.opened()[0]["title"]


def test_root_that_only_lost_its_peer_points_to_the_real_cause(tmp_path: Path) -> None:
    line = "ZeroDivisionError: division by zero"
    run = crashed_run(tmp_path, 0, 1, {0: TRACEBACK.format(r=0, last=PEER), 1: TRACEBACK.format(r=1, last=line)})
    got = run.opened()
    assert [(g["code"], g["evidence"]["rank"]) for g in got] == [("crash", 1)]
    # the log tail shown is the blamed rank's (was rank 0's, torchrun's first)
    tail = got[0]["evidence"]["log_tail"]
    assert any(line in ln for ln in tail) and not any("Connection closed by peer" in ln for ln in tail)


def test_sigterm_from_outside_is_no_incident(tmp_path: Path) -> None:
    run = crashed_run(tmp_path, 0, -15, {0: "step 12\n", 1: "step 12\n"})
    assert run.opened() == []


def test_killed_run_is_no_crash(tmp_path: Path) -> None:
    run = crashed_run(tmp_path, 0, -15, {})
    run.status({"state": "killed", "attempt": 1, "exit_code": -15})
    run.poll()
    assert run.opened() == []


def test_crash_closes_when_the_next_attempt_runs_and_a_second_crash_reopens(tmp_path: Path) -> None:
    line = "RuntimeError: injected crash"
    run = crashed_run(tmp_path, 1, 1, {1: TRACEBACK.format(r=1, last=line)})
    assert len(run.opened("crash")) == 1
    run.status({"state": "starting", "attempt": 2, "exit_code": None})
    run.poll()
    assert [r["code"] for r in run.closed()] == ["crash"]
    run.start(start_step=10)
    for _ in range(5):
        run.do_step(step_time=0.3)
    run.status({"state": "failed", "attempt": 2, "exit_code": 1})
    run.poll()
    assert len(run.opened("crash")) == 2
    # what is written is what was returned, in order
    assert [(r["code"], r["status"]) for r in run.file()] == [(r["code"], r["status"]) for r in run.records]


def test_a_dead_rank_with_a_traceback_is_a_crash_before_torchrun_reports(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r")
    run.start()
    for _ in range(12):
        run.do_step(step_time=0.3)
    run.pids[1] = dead_pid()
    run.heartbeat(1, run.step)
    run.poll()
    assert run.opened() == []  # gone, but no cause yet: wait for torchrun's word
    line = "RuntimeError: injected crash at step 13 on rank 1"
    run.paths.rank_log(1).write_text(TRACEBACK.format(r=1, last=line))
    run.paths.rank_log(0).write_text("step 12\n")
    run.poll()
    got = run.opened()
    assert [(g["code"], g["evidence"]["rank"], g["evidence"]["source"]) for g in got] == [("crash", 1, "rank logs")]


def test_an_earlier_attempts_traceback_does_not_explain_this_one(tmp_path: Path) -> None:
    old = "RuntimeError: injected crash at step 13 on rank 1"
    run = crashed_run(tmp_path, 1, 1, {1: TRACEBACK.format(r=1, last=old)})
    assert run.opened("crash")[0]["evidence"]["line"] == old
    run.status({"state": "starting", "attempt": 2, "exit_code": None})
    run.poll()
    run.start(start_step=10)
    for _ in range(5):
        run.do_step(step_time=0.3)
    # attempt 2 is SIGKILLed: nothing new in the logs, torchrun reports -9
    with open(run.paths.logs / "torchrun.log", "a") as f:
        f.write(TORCHRUN_REPORT.format(root=1, other=0, code=-9))
    run.status({"state": "failed", "attempt": 2, "exit_code": 1})
    run.poll()
    second = run.opened("crash")[1]
    assert second["evidence"]["signal"] == "SIGKILL" and second["evidence"]["line"] is None


def test_mt_kill_terminating_loader_workers_is_no_crash(tmp_path: Path) -> None:
    term = "RuntimeError: DataLoader worker (pid 21925) is killed by signal: Terminated. "
    run = FakeRun(tmp_path / "r")
    run.start()
    for _ in range(12):
        run.do_step(step_time=0.3)
    run.pids[0] = dead_pid()  # rank 0 died of its worker's SIGTERM; torchrun still tearing down
    run.heartbeat(0, run.step)
    run.paths.rank_log(0).write_text(TRACEBACK.format(r=0, last=term))
    run.poll()
    run.status({"state": "running", "attempt": 1, "exit_code": 1})
    run.poll()
    assert run.opened() == []


def test_loader_worker_killed_with_full_host_memory_is_oom(tmp_path: Path) -> None:
    line = "RuntimeError: DataLoader worker (pid 812) is killed by signal: Killed. "
    run = crashed_run(tmp_path, 0, 1, {0: TRACEBACK.format(r=0, last=line)}, host_mem=0.96)
    assert [g["code"] for g in run.opened()] == ["oom"]


def test_an_error_printed_after_the_last_step_is_a_crash_under_way(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r")
    run.start()
    run.paths.rank_log(1).write_text(TRACEBACK.format(r=1, last="UserWarning: harmless, long before"))
    for _ in range(12):
        run.do_step(step_time=0.3)
    with open(run.paths.rank_log(1), "a") as f:  # still alive, tearing down its process group
        f.write(TRACEBACK.format(r=1, last="RuntimeError: injected crash at step 13 on rank 1"))
    run.idle(1)
    assert run.opened() == []  # one quiet second is nothing yet
    run.idle(2)
    got = run.opened()
    assert [(g["code"], g["evidence"]["rank"]) for g in got] == [("crash", 1)]
    assert got[0]["evidence"]["line"].startswith("RuntimeError: injected crash")


def test_an_old_traceback_of_a_live_run_is_no_crash(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r", checkpoint_every=12)
    run.start()
    for _ in range(6):
        run.do_step(step_time=0.3)
    with open(run.paths.rank_log(0), "a") as f:  # printed and survived: the run kept stepping
        f.write(TRACEBACK.format(r=0, last="ValueError: a retried read failed"))
    for _ in range(6):
        run.do_step(step_time=0.3)
    with open(run.paths.rank_log(0), "a") as f:  # printed while the due checkpoint is written
        f.write(TRACEBACK.format(r=0, last="OSError: slow disk, retrying"))
    run.idle(8)
    assert run.opened() == []


def test_the_supervisors_tick_is_all_the_monitor_needs(tmp_path: Path) -> None:
    """Status, events and system samples come from the supervisor in memory: here status.json,
    events.jsonl and system.jsonl do not even exist, and the OOM killer is still named."""
    from mt.contract.config import MonitorConfig
    from mt.contract.records import parse_event
    from mt.contract.status import Status
    from mt.contract.system import clean_sample
    from tui.diagnose.memory import RunFacts
    from tui.diagnose.monitor import IncidentMonitor, Tick

    from .fakerun import T0

    root = tmp_path / "r"
    (root / "logs").mkdir(parents=True)
    mon = IncidentMonitor(root, MonitorConfig(), facts=RunFacts(world_size=2))
    status = {"state": "running", "attempt": 1, "exit_code": None}
    events = [parse_event({"v": 1, "t": T0, "kind": "run_start", "attempt": 1, "world_size": 2})]
    events += [parse_event({"v": 1, "t": T0 + s, "kind": "step", "step": s, "loss": 2.0, "step_time_s": 0.3,
                            "data_wait_s": 0.0, "tokens_per_s": 100.0}) for s in range(1, 13)]
    assert mon.observe(Tick(T0 + 12, Status.parse(status), events, [], {0: os.getpid(), 1: os.getpid()})) == []
    (root / "logs" / "torchrun.log").write_text(TORCHRUN_REPORT.format(root=1, other=0, code=-9))
    (root / "logs" / "rank1.log").write_text("step 1\nstep 12\n")
    sample = clean_sample({"v": 1, "t": T0 + 12, "gpus": [], "ranks": [],
                           "host": {"mem_used_bytes": 97, "mem_total_bytes": 100}})
    status = {**status, "exit_code": 1, "reason": "a worker exited"}
    got = mon.observe(Tick(T0 + 13, Status.parse(status), [], [sample], {0: dead_pid(), 1: dead_pid()}))
    assert [(g["code"], g["evidence"]["rank"], g["evidence"]["signal"]) for g in got] == [("oom", 1, "SIGKILL")]
    assert not any((root / name).exists() for name in ("status.json", "events.jsonl", "system.jsonl", "config.json"))


@pytest.mark.parametrize("before", ["no run_start", "attempt 2 before its run_start", "resumed, no step yet"])
def test_a_crash_before_any_step_names_no_step(tmp_path: Path, before: str) -> None:
    # a factory that raises, or a script that reports nothing through mt: no step ran in this attempt
    run = FakeRun(tmp_path / "r")
    if before != "no run_start":
        run.start()
        for _ in range(5):
            run.do_step()
    if before == "resumed, no step yet":
        run.start(start_step=5)
    run.paths.rank_log(0).write_text(TRACEBACK.format(r=0, last="ValueError: the model factory failed"))
    run.status({"state": "failed", "attempt": 2 if before != "no run_start" else 1, "exit_code": 1, "direct": True})
    run.poll()
    [inc] = run.opened()
    assert inc["step"] is None and inc["title"] == "Worker crashed: rank 0 before the first step", inc
