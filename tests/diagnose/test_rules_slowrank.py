"""The slow-rank rule on recorded step anatomies (heartbeat records of real 2-rank CPU runs)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from mt.contract.anatomy import StepAnatomy
from mt.contract.config import MonitorConfig
from mt.contract.heartbeat import clean_heartbeat
from mt.contract.records import parse_event
from mt.contract.status import Status
from tui.diagnose.findings import Observation
from tui.diagnose.memory import RuleMemory, RunFacts
from tui.diagnose.rules import evaluate
from tui.diagnose.slowrank import HOLD_S, slow_rank

NOW = 1_800_000_000.0
# heartbeat anatomies as the engine wrote them: rank 1's dataset sleeps 10 ms an item (8 items a step)
INPUT = {0: {"n": 20, "step_s": 0.09036, "data_s": 0.0007804, "compute_s": 0.002731, "optim_s": 0.0009271, "comm_s": 0.08554},
         1: {"n": 20, "step_s": 0.09053, "data_s": 0.08346, "compute_s": 0.003233, "optim_s": 0.0009633, "comm_s": 0.002394}}
# rank 1's forward sleeps 40 ms
COMPUTE = {0: {"n": 20, "step_s": 0.0871, "data_s": 0.0009, "compute_s": 0.0031, "optim_s": 0.0009, "comm_s": 0.0822},
           1: {"n": 20, "step_s": 0.0874, "data_s": 0.0009, "compute_s": 0.0828, "optim_s": 0.0010, "comm_s": 0.0021}}
BALANCED = {0: {"n": 20, "step_s": 0.0061, "data_s": 0.0008, "compute_s": 0.0031, "optim_s": 0.0009, "comm_s": 0.0011},
            1: {"n": 20, "step_s": 0.0062, "data_s": 0.0009, "compute_s": 0.0029, "optim_s": 0.0010, "comm_s": 0.0014}}
# a library script: the step between run.step calls and its own data_s, no collective seen
SCRIPT = {0: {"n": 20, "step_s": 0.131, "data_s": 0.002}, 1: {"n": 20, "step_s": 0.131, "data_s": 0.128}}


def signals(cores: int = 2) -> RuleMemory:
    memory = RuleMemory(RunFacts(world_size=2, host_cores=cores))
    memory.feed_event(parse_event({"v": 1, "t": NOW - 60, "kind": "run_start", "attempt": 1, "world_size": 2}))
    memory.feed_event(parse_event({"v": 1, "t": NOW - 1, "kind": "step", "step": 100, "step_time_s": 0.09}))
    return memory


def observe(anatomies: dict[int, dict[str, Any]], open_evidence: dict[str, Any] | None = None) -> Observation:
    hbs = {r: clean_heartbeat({"step": 100, "t": NOW - 0.5, "rank": r, "attempt": 1, "phase": "train", "anatomy": a})
           for r, a in anatomies.items()}
    return Observation(NOW, Status(state="running", attempt=1), hbs, open_codes=frozenset(open_evidence or ()),
                       open_evidence=open_evidence or {})


def test_input_bound_rank_is_named_with_the_others_wait() -> None:
    f = slow_rank(signals(), observe(INPUT), MonitorConfig())
    assert f is not None and f.code == "straggler"
    assert f.evidence["rank"] == 1 and f.evidence["bound"] == "input"
    assert f.detail.startswith("rank 1 is input-bound: it waits 83 ms a step for data while rank 0 waits ~86 ms in all-reduce")
    assert "num_workers" in f.advice
    assert set(f.evidence["anatomy"]) == {"0", "1"}


def test_compute_bound_rank_is_named() -> None:
    f = slow_rank(signals(), observe(COMPUTE), MonitorConfig())
    assert f is not None and f.evidence["rank"] == 1 and f.evidence["bound"] == "compute"
    assert "forward/backward" in f.detail and "82 ms in all-reduce" in f.detail


def test_compute_bound_on_a_busy_host_says_so() -> None:
    memory = signals(cores=8)
    for t in range(5):  # the host 50% of 8 cores busy, the two ranks one core between them: 3 cores elsewhere
        memory.feed_system({"t": NOW - 10 + t, "host": {"cpu_pct": 50.0}, "ranks": [{"rank": 0, "cpu_pct": 50.0},
                                                                                 {"rank": 1, "cpu_pct": 50.0}], "gpus": []})
    f = slow_rank(memory, observe(COMPUTE), MonitorConfig())
    assert f is not None and "busy with something else (3.0 cores" in f.detail and f.evidence["host_busy_cores"] == 3.0


def test_a_script_reporting_data_s_is_named_input_bound() -> None:
    f = slow_rank(signals(), observe(SCRIPT), MonitorConfig())
    assert f is not None and f.evidence["bound"] == "input"
    assert "it waits 128 ms a step for data while rank 0 waits ~126 ms" in f.detail


@pytest.mark.parametrize("anatomies", [BALANCED, {r: {k: v for k, v in a.items() if k != "data_s"} for r, a in SCRIPT.items()}],
                         ids=["balanced", "script-without-data_s"])
def test_no_alarm(anatomies: dict[int, dict[str, Any]]) -> None:
    assert slow_rank(signals(), observe(anatomies), MonitorConfig()) is None


def test_hysteresis_a_smaller_gap_keeps_an_open_incident_only() -> None:
    # rank 1 is 15 ms slower on a 60 ms step: under the 20 ms to open, over the half to stay open
    near = {0: {**BALANCED[0], "step_s": 0.06, "comm_s": 0.0161}, 1: {**BALANCED[1], "step_s": 0.06, "data_s": 0.0159}}
    assert slow_rank(signals(), observe(near), MonitorConfig()) is None
    held = slow_rank(signals(), observe(near, {"straggler": {"rank": 1, "step": 90}}), MonitorConfig())
    assert held is not None and held.evidence["rank"] == 1


def test_not_judged_before_the_window_fills_or_when_stale() -> None:
    young = {r: {**a, "n": 5} for r, a in INPUT.items()}
    assert slow_rank(signals(), observe(young), MonitorConfig()) is None
    obs = observe(INPUT)
    obs.heartbeats[1]["t"] = NOW - 60  # a rank that stopped beating is the hang rule's
    assert slow_rank(signals(), obs, MonitorConfig()) is None


def test_evaluate_reports_it_as_the_straggler() -> None:
    assert evaluate(signals(), observe(INPUT), MonitorConfig())["straggler"].evidence["bound"] == "input"


def test_the_heartbeat_fragment_parses_back() -> None:
    a = StepAnatomy(window=4, refresh=1)
    assert a.fragment() == ""
    for i in range(6):
        a.add(0.1 + i / 1000, 0.05, None, None, 1e-6 * i)
    rec = json.loads('{"step":1,"t":2.0' + a.fragment() + "}")
    assert rec["anatomy"] == {"n": 4, "step_s": 0.104, "data_s": 0.05, "comm_s": 4e-06}
    bad = clean_heartbeat({"step": 1, "t": 2.0, "anatomy": {"n": 3, "step_s": "x", "data_s": -1}})
    assert bad == {"step": 1, "t": 2.0}


# +50 ms in rank 1's forward on ~0.3 s steps (the engine's anatomy with [faults] slow_step_s): 15% of a step
SLOWER = {0: {"n": 20, "step_s": 0.352, "data_s": 0.0009, "compute_s": 0.2531, "optim_s": 0.0009, "comm_s": 0.0561},
          1: {"n": 20, "step_s": 0.353, "data_s": 0.0009, "compute_s": 0.3032, "optim_s": 0.0010, "comm_s": 0.0052}}


def _ticks(memory: RuleMemory, seconds: int, anatomies: Any) -> list[float]:
    """One judgement a second (as the supervisor ticks) for `seconds`; the times it named a straggler."""
    named = []
    for i in range(seconds + 1):
        a = anatomies(i) if callable(anatomies) else anatomies
        obs = observe(a)
        obs.now = NOW + i
        for hb in obs.heartbeats.values():
            hb["t"] = obs.now - 0.5
        if slow_rank(memory, obs, MonitorConfig()) is not None:
            named.append(float(i))
    return named


def test_a_ten_percent_gap_is_named_once_held_for_30_s() -> None:
    memory = signals()
    named = _ticks(memory, 40, SLOWER)
    assert named and named[0] == HOLD_S, named   # not before: a gap under 20% needs its 30 s
    obs = observe(SLOWER)
    obs.now = NOW + 41
    for hb in obs.heartbeats.values():
        hb["t"] = obs.now - 0.5
    f = slow_rank(memory, obs, MonitorConfig())
    assert f is not None and f.evidence["rank"] == 1 and f.evidence["bound"] == "compute" and f.evidence["held_s"] == 41.0
    assert f.detail.endswith("(medians of the ranks' last steps; a step takes 352 ms, 15% of it, for 41 s)"), f.detail


def test_a_gap_that_breaks_before_30_s_starts_its_clock_again() -> None:
    # every 20 s one second of balance (a rank's window of fast steps): never 30 s without a break
    assert _ticks(signals(), 90, lambda i: BALANCED if i % 20 == 19 else SLOWER) == []


def test_a_balanced_run_whose_ranks_trade_places_is_never_named() -> None:
    # either rank 5% slower in turn, as scheduling noise on a shared host makes it
    def noisy(i: int) -> dict[int, dict[str, Any]]:
        fast, slow = (0, 1) if (i // 7) % 2 else (1, 0)
        return {fast: {**SLOWER[0], "compute_s": 0.2531}, slow: {**SLOWER[0], "compute_s": 0.2531 + 0.016, "comm_s": 0.04}}
    assert _ticks(signals(), 120, noisy) == []
