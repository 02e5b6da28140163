"""The slow rank in synchronous training: every rank keeps the same pace (the all-reduce waits for the
slowest), so no heartbeat falls behind; the ranks' step anatomies (heartbeat records) show who waits
for whom, and the slow rank's own parts say why: input-bound or compute-bound."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from mt.contract.config import MonitorConfig
from mt.contract.incident import Incident
from tui.diagnose.findings import Observation
from tui.diagnose.hang import running, this_attempt
from tui.diagnose.memory import RuleMemory
from tui.format.fmt import fmt_ms

MIN_STEPS = 10      # a window this full before a rank is judged (start-up steps are not its pace)
GAP_S = 0.02        # the slow rank's own time over the others' median, at least this in absolute terms
GAP_SHARE = 0.2     # ... and this share of a step names it at once: a few ms on a fast step is noise
HELD_SHARE = 0.1    # a smaller gap, this share of a step or more, names it once held HOLD_S without a break
HOLD_S = 30.0       # a balanced run's ranks trade places within seconds; a slower device stays slower
KEEP = 0.5          # an open incident stays while the gap is over half of its bar (hysteresis)
FRESH_S = 30.0      # a heartbeat older than this is the hang rule's, not a pace
HOST_BUSY_CORES = 1.0  # cores busy outside the ranks that make "something else" worth saying

ADVICE_INPUT = (
    "This rank's input pipeline is slower than its peers': give its DataLoader more workers "
    "([data] num_workers), pinned memory and prefetching (prefetch_factor), and check its shard "
    "(longer samples, slower storage, a cold cache); the others' all-reduce waits for every batch it loads."
)
ADVICE_COMPUTE = (
    "This rank computes its forward/backward slower than its peers: check its device (clocks, "
    "temperature, throttling, nvidia-smi), other processes on its host or GPU, and uneven work per "
    "rank (variable sequence lengths need bucketing or packing)."
)


@dataclass
class Parts:
    """One rank's median step parts (seconds); None where its producer cannot see the part."""

    step_s: float
    data_s: float | None
    work_s: float | None   # forward+backward and optimizer: the rank's own compute
    comm_s: float | None   # its wait in the step's collectives

    @property
    def busy_s(self) -> float | None:
        """The rank's own time in a step: all but its wait for others (or its data wait, all a script reports)."""
        return self.step_s - self.comm_s if self.comm_s is not None else self.data_s


def _parts(memory: RuleMemory, obs: Observation) -> dict[int, Parts]:
    out = {}
    for rank, hb in this_attempt(memory, obs).items():
        a = hb.get("anatomy") or {}
        if hb.get("phase", "train") != "train" or obs.now - hb["t"] > FRESH_S or a.get("n", 0) < MIN_STEPS:
            continue
        work = a["compute_s"] + a.get("optim_s", 0.0) if "compute_s" in a else None
        out[rank] = Parts(a["step_s"], a.get("data_s"), work, a.get("comm_s"))
    return out


def _gap(slow: Parts, others: list[Parts], part: str) -> float | None:
    values = [getattr(p, part) for p in others]
    mine = getattr(slow, part)
    return None if mine is None or None in values else mine - statistics.median(values)


def _host_busy(memory: RuleMemory, obs: Observation, node: str | None) -> float | None:
    """Cores busy on the host besides the ranks, over the last 30 s of system samples (None: unknown;
    in a job, `node`'s: the slow rank's host)."""
    cores = memory.facts.host_cores
    spare = []
    for s in memory.recent_system(obs.now, 30.0, node):
        host = (s.get("host") or {}).get("cpu_pct")
        ranks = [r.get("cpu_pct") for r in s.get("ranks") or []]
        if cores and host is not None and None not in ranks:
            spare.append(host / 100 * cores - sum(ranks) / 100)
    return statistics.median(spare) if spare else None


def _named(memory: RuleMemory, now: float, slow: int, gap: float, step_s: float, is_open: bool) -> bool:
    """Whether the gap names the rank: over GAP_SHARE of a step now, or over HELD_SHARE since HOLD_S
    (the clock restarts when the gap falls under it or another rank is the slowest)."""
    if gap >= max(GAP_S, HELD_SHARE * step_s) * (KEEP if is_open else 1.0):
        if memory.slow_since is None or memory.slow_since[0] != slow:
            memory.slow_since = (slow, now)
    else:
        memory.slow_since = None
    if gap >= max(GAP_S, GAP_SHARE * step_s) * (KEEP if is_open else 1.0):
        return True
    return memory.slow_since is not None and now - memory.slow_since[1] >= HOLD_S


def slow_rank(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> Incident | None:
    """A rank whose own time a step exceeds the others' by GAP_S and GAP_SHARE of a step (or
    HELD_SHARE, held for HOLD_S), and why."""
    if not running(memory, obs):
        return None
    parts = _parts(memory, obs)
    if len(parts) < 2 or any(p.busy_s is None for p in parts.values()):
        return None
    slow = max(parts, key=lambda r: parts[r].busy_s or 0.0)
    me, others = parts[slow], [p for r, p in parts.items() if r != slow]
    gap = _gap(me, others, "busy_s") or 0.0
    step_s = statistics.median(p.step_s for p in parts.values())
    is_open = (obs.open_evidence.get("straggler") or {}).get("rank") == slow
    if not _named(memory, obs.now, slow, gap, step_s, is_open):
        return None
    data_gap, work_gap = _gap(me, others, "data_s"), _gap(me, others, "work_s")
    input_bound = data_gap is not None and (work_gap is None or data_gap >= work_gap)
    bound = "input" if input_bound else "compute" if work_gap is not None else None
    if bound is None:
        return None
    # what the others wait: their collective wait, or (a script) their step beyond their data less the slow one's
    waits = [p.comm_s for p in others] if me.comm_s is not None else [
        (p.step_s - (p.data_s or 0.0)) - (me.step_s - (me.data_s or 0.0)) for p in others]
    wait_s = max(statistics.median(waits), 0.0)  # type: ignore[type-var]
    peers = obs.whom([r for r in sorted(parts) if r != slow])   # in a job each with its node, as the hang names them
    verb = "waits" if len(others) == 1 else "wait"
    own = f"it waits {fmt_ms(me.data_s)} a step for data" if input_bound else \
        f"its forward/backward and optimizer take {fmt_ms(me.work_s)} a step"
    why = f"{obs.who(slow)} is {bound}-bound: {own} while rank {peers} {verb} ~{fmt_ms(wait_s)} in all-reduce for it"
    held_s = obs.now - memory.slow_since[1] if memory.slow_since is not None else 0.0
    steady = f", {gap / step_s:.0%} of it, for {held_s:.0f} s" if gap < GAP_SHARE * step_s else ""
    detail = f"{why} (medians of the ranks' last steps; a step takes {fmt_ms(step_s)}{steady})"
    busy = _host_busy(memory, obs, obs.nodes.get(slow)) if bound == "compute" else None
    if busy is not None and busy >= HOST_BUSY_CORES:
        detail += f"; its host's CPU is busy with something else ({busy:.1f} cores besides the ranks)"
    evidence: dict[str, Any] = {
        "why": why, "rank": slow, **({"node": obs.nodes[slow]} if slow in obs.nodes else {}), "bound": bound, "gap_s": round(gap, 4),
        "wait_s": round(wait_s, 4), "step_s": round(step_s, 4), "held_s": round(held_s, 1),
        "host_busy_cores": None if busy is None else round(busy, 2),
        "anatomy": {str(r): {k: v for k, v in p.__dict__.items() if v is not None} for r, p in sorted(parts.items())},
    }
    advice = ADVICE_INPUT if input_bound else ADVICE_COMPUTE + (" Other processes share this host's CPU now: "
                                                                "check them (top)." if busy and busy >= 1 else "")
    return Incident("straggler", "warn", memory.last_step.step if memory.last_step else None,
                    f"Straggler: {obs.who(slow)} is {bound}-bound", detail, advice, evidence)
