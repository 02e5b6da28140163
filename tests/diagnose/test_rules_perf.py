"""dataloader_stall, throughput_drop, memory_pressure on synthetic streams."""
from __future__ import annotations

from pathlib import Path

from mt.contract.config import MonitorConfig

from .fakerun import FakeRun


def warm(run: FakeRun, n: int = 30, step_time: float = 0.25, **kw: object) -> None:
    run.start()
    for _ in range(n):
        run.do_step(step_time=step_time, data_wait=0.01, **kw)


def test_stall_fires_at_the_stalled_step_once(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r")
    warm(run)
    at = run.step + 1
    for _ in range(8):  # every batch now waits 2 s for data
        run.do_step(step_time=2.2, data_wait=2.0)
    got = run.opened("dataloader_stall")
    assert len(got) == 1 and got[0]["step"] == at
    assert got[0]["t"] <= run.monitor.memory.step_times[at] + 1e-6  # seen on the step's own poll
    ev = got[0]["evidence"]
    assert ev["data_share"] >= MonitorConfig().stall_data_share and ev["num_workers"] == 1
    assert "num_workers" in got[0]["advice"] and "tokenize offline" in got[0]["advice"]
    assert run.warn_or_error() == got  # no throughput_drop or hang on top of it


def test_one_long_stall_fires_when_its_step_lands(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r")
    warm(run)
    run.do_step(step_time=8.3, data_wait=8.0)
    got = run.opened("dataloader_stall")
    assert [g["step"] for g in got] == [run.step]


def test_stall_between_two_polls_of_a_fast_run_is_seen(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r")
    warm(run, step_time=0.05)
    at = run.step + 1
    run.do_step(step_time=4.5, data_wait=4.4, poll=False)
    for _ in range(12):  # far more steps than the stall window holds before the next poll
        run.do_step(step_time=0.05, poll=False)
    run.poll()
    assert [g["step"] for g in run.opened("dataloader_stall")] == [at]


def test_stall_closes_after_it_clears_and_can_reopen(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run)
    for _ in range(5):
        run.do_step(step_time=2.2, data_wait=2.0)
    for _ in range(int(m.close_after_s / 0.25) + m.stall_steps + 8):
        run.do_step(step_time=0.25, data_wait=0.01)
    assert [r["code"] for r in run.closed()] == ["dataloader_stall"]
    again = run.step + 1
    for _ in range(5):
        run.do_step(step_time=2.2, data_wait=2.0)
    assert [r["step"] for r in run.opened("dataloader_stall")][-1] == again
    assert len(run.opened("dataloader_stall")) == 2


def test_small_waits_and_fast_steps_are_no_stall(tmp_path: Path) -> None:
    run = FakeRun(tmp_path / "r")
    warm(run, 60, step_time=0.004)  # data wait 10 ms of 4 ms steps: share high, seconds tiny
    assert run.opened("dataloader_stall") == []


def test_gpu_idle_lowers_the_bar_busy_gpu_does_not(tmp_path: Path) -> None:
    m = MonitorConfig()
    share = m.stall_data_share * 0.7  # below the CPU-only bar, above half of it
    for util, expect in ((3.0, 1), (95.0, 0)):
        run = FakeRun(tmp_path / f"r{util}", monitor=m)
        warm(run, 10, step_time=1.0, )
        for _ in range(int(m.stall_window_s) + 5):
            run.do_step(step_time=1.0, data_wait=share)
            run.sample(gpu_util=util)
        got = run.opened("dataloader_stall")
        assert len(got) == expect, (util, got)
        if expect:
            assert got[0]["evidence"]["gpu_util_pct"] <= m.stall_gpu_util_pct
            assert "GPU utilisation" in got[0]["detail"]


def test_a_stall_on_a_cuda_run_says_a_waiting_gpu_reads_busy(tmp_path: Path) -> None:
    # ranks waiting in NCCL for the starved one keep their GPUs "busy": the stall's detail says so on a CUDA run only
    m = MonitorConfig()
    for backend, said in (("nccl", True), ("gloo", False)):
        run = FakeRun(tmp_path / backend, monitor=m)
        run.start(backend=backend)
        for _ in range(int(m.stall_window_s) + 5):   # NVML's readings cover the window before the stall
            run.do_step(step_time=1.0, data_wait=0.01)
            run.sample(gpu_util=95.0)
        for _ in range(int(m.stall_window_s) + 5):
            run.do_step(step_time=1.0, data_wait=0.8)
            run.sample(gpu_util=95.0)
        (got,) = run.opened("dataloader_stall")
        assert ("NCCL's kernels spin while they wait" in got["detail"]) is said, got["detail"]


def test_throughput_drop_sustained_fires_once(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 80, step_time=0.5)
    at = run.step + 1
    for _ in range(int(m.throughput_window_s * 2 / 1.5)):  # 3x slower steps, data wait unchanged
        run.do_step(step_time=1.5, data_wait=0.01)
    got = run.opened("throughput_drop")
    assert len(got) == 1 and got[0]["step"] == at
    ev = got[0]["evidence"]
    assert ev["ratio"] < m.throughput_drop_share
    # detected once the low rate covered half the window, not before
    t_first = run.monitor.memory.step_times[at]
    assert got[0]["t"] - t_first >= 0.5 * m.throughput_window_s - 1.5
    assert got[0]["t"] - t_first <= 0.5 * m.throughput_window_s + 3.0


def test_throughput_drop_names_an_oversubscribed_host(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    run.monitor.memory.facts.host_cores = 2
    warm(run, 80, step_time=0.5)
    for _ in range(int(m.throughput_window_s / 1.5)):
        run.do_step(step_time=1.5, data_wait=0.01)
        run.sample(load1=7.5, rank_cpu=16.0)
    got = run.opened("throughput_drop")
    assert len(got) == 1 and "oversubscribed: load 7.5 on 2 cores" in got[0]["detail"]
    assert got[0]["evidence"]["host"]["rank_cpu_pct"] == [16.0, 16.0]


def test_one_long_step_is_no_throughput_drop(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 80, step_time=0.3, sleep=0.4)  # paced like the demos: the engine times 0.3 of 0.7 s
    run.do_step(step_time=m.throughput_window_s * 0.6, data_wait=0.01)  # a 18 s freeze, once
    for _ in range(80):
        run.do_step(step_time=0.3, sleep=0.4)
    assert run.records == []


def test_a_stall_does_not_echo_as_a_throughput_drop(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 80, step_time=0.3, sleep=0.4)
    run.do_step(step_time=10.0, data_wait=9.8, sleep=0.4)
    for _ in range(80):  # long enough for the stall to close while step 81 is still in the window
        run.do_step(step_time=0.3, sleep=0.4)
    assert [r["code"] for r in run.opened()] == ["dataloader_stall"]


def test_short_dip_and_pauses_are_no_throughput_drop(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m, eval_every=20, checkpoint_every=50)
    warm(run, 80, step_time=0.5)
    for _ in range(int(m.throughput_window_s / 4 / 1.5)):  # a dip far shorter than the window
        run.do_step(step_time=1.5, data_wait=0.01)
    for _ in range(100):
        run.do_step(step_time=0.5, data_wait=0.01)
        if run.step % 20 == 0:  # a slow eval after the step
            run.idle(10)
            run.event("eval", step=run.step, val_loss=2.0)
    assert run.records == []


def test_memory_pressure_needs_the_whole_window(tmp_path: Path) -> None:
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 5, step_time=1.0)
    for _ in range(int(m.memory_window_s / 2)):  # a burst at 97%: too short
        run.do_step(step_time=1.0)
        run.sample(gpu_util=90, mem_share=0.99, peak_share=0.97)
    for _ in range(10):
        run.do_step(step_time=1.0)
        run.sample(gpu_util=90, mem_share=0.99, peak_share=0.7)
    assert run.opened("memory_pressure") == []
    for _ in range(int(m.memory_window_s) + 3):
        run.do_step(step_time=1.0)
        run.sample(gpu_util=90, mem_share=0.99, peak_share=0.97)
    got = run.opened("memory_pressure")
    assert len(got) == 1
    ev = got[0]["evidence"]["ranks"]["1"]
    assert ev["min_share"] >= m.memory_pressure_share and ev["mem_peak_bytes"] == int(80 * 2**30 * 0.97), ev
    assert "allocated" in got[0]["detail"] and "NVML's used memory is not judged" in got[0]["detail"]


def test_a_well_packed_run_at_99_percent_of_nvml_is_no_memory_pressure(tmp_path: Path) -> None:
    # NVML's used counts the allocator's cache, the CUDA context and NCCL's buffers: a healthy run sits at 99%
    # while its allocator's per-step peak is at 70%; and a run whose ranks report no allocator is not judged
    m = MonitorConfig()
    run = FakeRun(tmp_path / "r", monitor=m)
    warm(run, 5, step_time=1.0)
    for _ in range(int(m.memory_window_s) * 2):
        run.do_step(step_time=1.0)
        run.sample(gpu_util=90, mem_share=0.99, peak_share=0.7)
    for _ in range(int(m.memory_window_s) * 2):
        run.do_step(step_time=1.0)
        run.sample(gpu_util=90, mem_share=0.99)
    assert run.opened("memory_pressure") == []
