"""Incident rules over a run's streams: pure functions, no I/O, no torch.

`RuleMemory` (memory.py) accumulates events and system samples; each poll the caller
gathers an `Observation` (findings.py: status, heartbeats, rank processes, log tails) and
`evaluate` returns the incidents whose condition holds now, each an `Incident`
(mt/contract/incident.py). Opening, closing and writing them is monitor.py's job; the rules live
in perf.py, hang.py, slowrank.py, stall.py and exit.py. Rank 0's rules, inside training, are mt/rules.py.
"""
from __future__ import annotations

from mt.contract.config import MonitorConfig
from mt.contract.incident import Incident
from tui.diagnose import exit as diagnose_exit
from tui.diagnose import hang as diagnose_hang
from tui.diagnose import perf as diagnose_perf
from tui.diagnose import slowrank
from tui.diagnose import stall as diagnose_stall
from tui.diagnose.findings import Observation
from tui.diagnose.memory import RuleMemory

RULES = (
    # a rank behind in steps first; else the one the others wait for at the same step (slowrank.py)
    diagnose_exit.worker_exit, diagnose_hang.hang, diagnose_hang.straggler, slowrank.slow_rank,
    diagnose_stall.dataloader_stall, diagnose_perf.throughput_drop, diagnose_perf.memory_pressure,
)


def evaluate(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> dict[str, Incident]:
    """Every rule whose condition holds now, keyed by code (at most one finding per code)."""
    found: dict[str, Incident] = {}
    for rule in RULES:
        finding = rule(memory, obs, m)
        if finding is not None and finding.code not in found:
            found[finding.code] = finding
    # The more specific diagnosis explains the other: a stalled loader or a hung rank is why
    # throughput fell, and a hang freezes every heartbeat (no rank is "behind" then).
    if "dataloader_stall" in found or "hang" in found or "dataloader_stall" in obs.open_codes:
        found.pop("throughput_drop", None)
    if "hang" in found:
        found.pop("straggler", None)
    # Every rank waiting on its input while the loader works is a stall, however long it lasts.
    if (found.get("dataloader_stall") and found["dataloader_stall"].evidence.get("in_progress")):
        found.pop("hang", None)
    return found
