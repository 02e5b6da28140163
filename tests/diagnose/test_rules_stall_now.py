"""A stall seen while it happens (from /proc), told apart from a hang: pure evaluate() calls."""
from __future__ import annotations

from mt.contract.config import MonitorConfig
from mt.contract.records import parse_event
from mt.contract.status import Status
from tui.diagnose.findings import ChildProc, Observation, RankProc
from tui.diagnose.memory import RuleMemory, RunFacts
from tui.diagnose.rules import evaluate

T0 = 1_800_000_000.0
STEP_S = 0.2


def signals(n: int = 20) -> RuleMemory:
    memory = RuleMemory(RunFacts(num_workers=1, world_size=2))
    memory.feed_event(parse_event({"kind": "run_start", "t": T0, "attempt": 1, "start_step": 0, "world_size": 2}))
    for k in range(1, n + 1):
        memory.feed_event(parse_event({"kind": "step", "t": T0 + k * STEP_S, "step": k, "step_time_s": STEP_S,
                        "data_wait_s": 0.01, "tokens_per_s": 1000.0}))
    return memory


def procs(main: dict[int, str], worker: dict[int, str]) -> dict[int, RankProc]:
    return {r: RankProc(r, 100 + r, True, 0.0, "S", main[r], [ChildProc(200 + r, "S", worker[r])]) for r in main}


def observe(memory: RuleMemory, idle: float, main: dict[int, str], worker: dict[int, str]) -> Observation:
    last = memory.last_step
    assert last is not None
    return Observation(now=last.t + idle, status=Status(state="running", attempt=1),
                       procs=procs(main, worker))


M = MonitorConfig(hang_floor_s=3.0, hang_step_factor=5.0)
WAITING = {0: "poll", 1: "poll"}


def test_workers_busy_while_every_rank_waits_is_a_stall_not_a_hang() -> None:
    memory = signals()
    found = evaluate(memory, observe(memory, 4.0, WAITING, {0: "clock_nanosleep", 1: "read"}), M)
    assert set(found) == {"dataloader_stall"}
    f = found["dataloader_stall"]
    assert f.step == 21 and f.evidence["in_progress"] and f.evidence["idle_s"] == 4.0
    assert "DataLoader workers are still busy" in f.detail


def test_idle_workers_mean_a_hang() -> None:
    memory = signals()
    found = evaluate(memory, observe(memory, 4.0, WAITING, {0: "poll", 1: "futex"}), M)
    assert set(found) == {"hang"}


def test_a_rank_asleep_in_its_own_code_is_a_hang_with_that_suspect() -> None:
    memory = signals()
    found = evaluate(memory, observe(memory, 4.0, {0: "futex", 1: "clock_nanosleep"}, {0: "clock_nanosleep", 1: "poll"}), M)
    assert set(found) == {"hang"}
    assert found["hang"].evidence["suspect_ranks"] == [1]


def test_a_short_wait_is_nothing() -> None:
    memory = signals()
    assert evaluate(memory, observe(memory, 2.0, WAITING, {0: "clock_nanosleep", 1: "clock_nanosleep"}), M) == {}


def test_ranks_computing_is_no_stall() -> None:
    memory = signals()
    obs = observe(memory, 4.0, {0: "running", 1: "poll"}, {0: "clock_nanosleep", 1: "poll"})
    obs.procs[0].cpu_pct = 100.0
    assert "dataloader_stall" not in evaluate(memory, obs, M)


def test_start_up_is_not_judged() -> None:
    memory = signals(n=2)  # the first batches of an attempt wait for freshly started workers
    found = evaluate(memory, observe(memory, 4.0, WAITING, {0: "running", 1: "running"}), MonitorConfig())
    assert found == {}


def test_a_waiting_loop_waking_up_still_counts_as_waiting() -> None:
    memory = signals()
    obs = observe(memory, 4.0, {0: "poll", 1: "running"}, {0: "clock_nanosleep", 1: "clock_nanosleep"})
    obs.procs[1].cpu_pct = 1.0
    assert set(evaluate(memory, obs, M)) == {"dataloader_stall"}
    obs.procs[1].cpu_pct = 90.0  # really computing: not a stall
    assert "dataloader_stall" not in evaluate(memory, obs, M)


def test_once_seen_as_a_stall_the_same_quiet_spell_is_no_hang() -> None:
    memory = signals()
    obs = observe(memory, 8.0, {0: "poll", 1: "running"}, {0: "clock_nanosleep", 1: "poll"})
    obs.procs[1].cpu_pct = 60.0  # a moment that looks like compute: the /proc view is ambiguous
    assert set(evaluate(memory, obs, M)) == {"hang"}
    obs.open_evidence = {"dataloader_stall": {"in_progress": True, "step": 21}}
    assert evaluate(memory, obs, M) == {}


def test_compile_workers_are_not_a_dataloader() -> None:
    memory = signals()
    obs = observe(memory, 4.0, WAITING, {0: "running", 1: "running"})
    for p in obs.procs.values():
        p.children[0].cmdline = "python -m torch._inductor.compile_worker --workers=8"
    assert "dataloader_stall" not in evaluate(memory, obs, M)


def test_no_stall_judged_while_an_eval_is_due() -> None:
    memory = RuleMemory(RunFacts(num_workers=1, world_size=2, eval_every=20, eval_batches=4))
    for ev in [{"kind": "run_start", "t": T0, "attempt": 1, "start_step": 0, "world_size": 2}] + [
            {"kind": "step", "t": T0 + k * STEP_S, "step": k, "step_time_s": STEP_S, "data_wait_s": 0.01,
             "tokens_per_s": 1000.0} for k in range(1, 21)]:
        memory.feed_event(parse_event(ev))
    found = evaluate(memory, observe(memory, 4.0, WAITING, {0: "clock_nanosleep", 1: "clock_nanosleep"}), M)
    assert "dataloader_stall" not in found
