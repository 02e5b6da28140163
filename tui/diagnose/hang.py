"""The hang rules, from heartbeats and rank processes: hang and straggler."""
from __future__ import annotations

import math
from typing import Any

from mt.contract.config import MonitorConfig
from mt.contract.events import as_float
from mt.contract.incident import Incident
from tui.diagnose.findings import WAITING_SYSCALLS, Observation, RankProc
from tui.diagnose.memory import WARMUP_STEPS, RuleMemory
from tui.format.fmt import fmt_s

EARLY_FLOOR_S = 3.0   # the least quiet spell named a hang early: a loaded host's scheduling hiccups stay under it
CONFIRM_S = 1.0       # the same rank(s) seen stopped while the others wait, over polls this far apart
ADVICE_HANG = (
    "Look at which rank stopped first and what the others do: ranks blocked in a collective "
    "(futex/poll, ~0% CPU or spinning) wait for the one that is stuck (sleeping, in I/O, or "
    "busy in its own code). Get its stack: `kill -USR2 PID` (mt's engine writes every thread's "
    "stack to logs/rank<N>.log) or `py-spy dump --pid PID`; check for a rank-"
    "dependent branch that skips a collective, a dead DataLoader worker, a full disk, or a "
    "GPU fault (nvidia-smi, dmesg). mt ends the attempt once the verdict is [monitor] "
    "hang_timeout_s old (`mt launch train.py --hang-timeout S` for a script) and restarts it from "
    "the newest checkpoint within [launch] max_restarts; `mt kill` ends it now."
)
ADVICE_STRAGGLER = (
    "One rank is slower than the rest and every collective waits for it. Check that rank's "
    "host and GPU (clocks, temperature, other processes, PCIe/NVLink errors), its data "
    "shard (longer samples, slower storage) and its DataLoader workers; uneven work per rank "
    "(variable sequence lengths) needs bucketing or packing."
)


def this_attempt(memory: RuleMemory, obs: Observation) -> dict[int, dict[str, Any]]:
    """Heartbeats written by the current attempt (older files are left-overs)."""
    out = {}
    for rank, hb in obs.heartbeats.items():
        att = hb.get("attempt")
        if memory.attempt is None or att is None or att == memory.attempt:
            out[rank] = hb
    return out


def running(memory: RuleMemory, obs: Observation) -> bool:
    """This attempt's engine is up and has not ended (a hang or a stall can only happen then)."""
    st = obs.status
    if not obs.live or st.state != "running" or st.exit_code not in (None, 0):
        return False
    if st.attempt is not None and memory.attempt is not None and st.attempt > memory.attempt:
        return False  # a new attempt is starting; its engine has not announced itself yet
    return memory.attempt is not None and memory.run_end is None


def last_progress(memory: RuleMemory, obs: Observation) -> float | None:
    """The newest sign of life of this attempt: an event or a heartbeat."""
    marks = [t for t in (memory.attempt_t0, memory.last_event_t) if t is not None]
    marks += [as_float(hb.get("t")) for hb in this_attempt(memory, obs).values()]
    marks = [t for t in marks if not math.isnan(t)]
    return max(marks) if marks else None


def _doing(p: RankProc | None) -> str:
    if p is None:
        return "no process info"
    if p.alive is False:
        return "exited"
    parts = []
    if p.syscall:
        parts.append("on CPU" if p.syscall == "running" else f"in {p.syscall}")
    if p.cpu_pct is not None:
        parts.append(f"{p.cpu_pct:.0f}% CPU")
    return ", ".join(parts) or "alive"


NCCL_SPIN = ("on a CUDA run a rank waiting in an NCCL collective spins (on CPU, its GPU busy), so on CPU is "
             "no sign of being stuck; the ranks' stacks decide")


def stacks_odd(evidence: dict[str, Any]) -> list[int]:
    """The ranks the captured stacks single out (the verdict's first, smallest group, when the ranks
    are at more than one place), from a hang's evidence; [] without a capture."""
    groups = evidence.get("groups")
    if not isinstance(groups, list) or len(groups) < 2 or not isinstance(groups[0], dict):
        return []
    ranks = groups[0].get("ranks")
    return sorted(r for r in ranks if isinstance(r, int) and not isinstance(r, bool)) if isinstance(ranks, list) else []


def blamed(evidence: dict[str, Any]) -> list[int]:
    """Who a hang's evidence names as stuck: its suspects, else the ranks its stacks single out."""
    named = evidence.get("suspect_ranks")
    return [r for r in named if isinstance(r, int)] if isinstance(named, list) and named else stacks_odd(evidence)


def _suspects(hbs: dict[int, dict[str, Any]], procs: dict[int, RankProc], nccl: bool = False,
              stacks: dict[str, Any] | None = None) -> tuple[list[int], str]:
    """The rank(s) the others wait for, and why we think so. `nccl`: the ranks' system calls say
    nothing (a waiting rank spins), only heartbeats and the captured `stacks` (a hang's evidence) do."""
    steps = {r: int(as_float(hb.get("step"))) for r, hb in hbs.items() if as_float(hb.get("step")) == as_float(hb.get("step"))}
    if steps and len(set(steps.values())) > 1:
        low = min(steps.values())
        return sorted(r for r, s in steps.items() if s == low), f"its heartbeat is behind (step {low})"
    odd = stacks_odd(stacks or {})
    if odd:
        return odd, f"its stack is not where the others are: {stacks.get('verdict') if stacks else ''}"
    if nccl:
        return [], ""
    waiting = sorted(r for r, p in procs.items() if p.alive and p.syscall in WAITING_SYSCALLS)
    other = sorted(r for r, p in procs.items() if p.alive and p.syscall and p.syscall not in WAITING_SYSCALLS)
    if waiting and other:
        calls = ", ".join(sorted({procs[r].syscall or "" for r in other}))
        return other, (f"it is in {calls} while rank {', '.join(map(str, waiting))} "
                       f"{'waits' if len(waiting) == 1 else 'wait'} for a peer, as in a collective")
    return [], ""


def early_limit(memory: RuleMemory, hbs: dict[int, dict[str, Any]], med: float | None, m: MonitorConfig) -> float | None:
    """The quiet spell after which a rank stopped while the others wait is a hang: max(3 s, factor x
    the median step interval), plus 3x the measured length of an eval or checkpoint under way; None
    when the run has no measured pace yet, or a pause under way was never measured (the floor decides)."""
    last = memory.last_step
    if last is None or med is None or last.step <= memory.start_step + WARMUP_STEPS:
        return None
    kinds = memory.pauses_due(last.step) | {hb.get("phase") for hb in hbs.values()} & {"eval", "checkpoint"}
    if memory.facts.script:   # a script's saves and evals come when it decides: any kind it has reported may run now
        kinds |= set(memory.pause_s)
    if any(k not in memory.pause_s for k in kinds):
        return None
    return max(EARLY_FLOOR_S, m.hang_step_factor * med) + sum(memory.pause_allowance(str(k)) for k in kinds)


def _confirmed(memory: RuleMemory, obs: Observation, hbs: dict[int, dict[str, Any]], idle: float,
               early: float | None) -> tuple[list[int], str] | None:
    """The stopped rank(s) and why, once the same ones were seen over CONFIRM_S past the early limit."""
    found = _suspects(hbs, obs.procs, memory.nccl) if early is not None and idle >= early else ([], "")
    if not found[0]:
        memory.stuck = None
        return None
    ranks = tuple(found[0])
    if memory.stuck is None or memory.stuck[0] != ranks:
        memory.stuck = (ranks, obs.now)
    return found if obs.now - memory.stuck[1] >= CONFIRM_S else None


def hang(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> Incident | None:
    """No new step for max(floor, factor x median step time) while rank processes live; sooner
    (`early_limit`) when one rank stopped while the others wait in a collective."""
    if not running(memory, obs):
        return None
    if obs.procs and not any(p.alive for p in obs.procs.values()):
        return None  # everyone has exited: that is for the exit rules
    hbs = this_attempt(memory, obs)
    last = memory.last_step
    progress = last_progress(memory, obs)
    if progress is None:
        return None
    med = memory.median_step_interval()
    limit = max(m.hang_floor_s, m.hang_step_factor * med) if med else m.hang_floor_s
    if last is None:
        limit *= 2  # start-up: first batches, allocator warm-up, compilation
    else:
        for kind in memory.pauses_due(last.step):  # a long eval or checkpoint is not a hang
            limit += m.hang_floor_s + memory.pause_allowance(kind)
    idle = obs.now - progress
    early = early_limit(memory, hbs, med, m)
    confirmed = _confirmed(memory, obs, hbs, idle, early)
    if idle < limit and confirmed is None:
        return None
    step = (last.step if last else memory.start_step) + 1
    stall = obs.open_evidence.get("dataloader_stall") or {}
    if stall.get("in_progress") and stall.get("step") == step:
        return None  # this quiet spell was already seen to be the input pipeline's
    suspects, why = confirmed or _suspects(hbs, obs.procs, memory.nccl, obs.open_evidence.get("hang"))
    early_named = confirmed is not None and early is not None and idle < limit
    if early_named:
        limit = early   # the ranks show who stopped: the stale mark is the early limit
    ranks = sorted(set(hbs) | set(obs.procs))
    per_rank = {}
    for r in ranks:
        hb, p = hbs.get(r, {}), obs.procs.get(r)
        age = obs.now - as_float(hb.get("t")) if hb else None
        per_rank[str(r)] = {
            "heartbeat_step": hb.get("step"), "heartbeat_age_s": None if age is None or math.isnan(age) else round(age, 1),
            "pid": p.pid if p else hb.get("pid"), "alive": p.alive if p else None,
            "cpu_pct": p.cpu_pct if p else None, "state": p.state if p else None,
            "syscall": p.syscall if p else None, "stale": age is not None and age >= limit,
            **({"node": obs.nodes[r]} if r in obs.nodes else {}),
        }
    stale = [r for r in ranks if per_rank[str(r)]["stale"]]
    lines = [f"{obs.who(r)}: heartbeat step {per_rank[str(r)]['heartbeat_step']}, "
             f"{fmt_s(per_rank[str(r)]['heartbeat_age_s'])} old, {_doing(obs.procs.get(r))}" for r in ranks]
    who = (f"rank {obs.whom(suspects)} looks stuck ({why}); " if suspects else "")
    how = (f"named early at {fmt_s(limit)}: one rank stopped while the others wait, seen for {fmt_s(CONFIRM_S)}"
           if early_named else f"limit {fmt_s(limit)}: max of {fmt_s(m.hang_floor_s)} and {m.hang_step_factor:g} x "
           f"the median {fmt_s(med)} between steps")
    detail = (f"no step for {fmt_s(idle)} after step {step - 1} ({how}); "
              f"{who}stale heartbeats: {obs.whom(stale) or 'none'}. " + "; ".join(lines)
              + (f" ({NCCL_SPIN})" if memory.nccl and not suspects else ""))
    evidence = {"idle_s": round(idle, 1), "limit_s": round(limit, 1), "last_step": step - 1,
                "median_step_interval_s": med, "stale_ranks": stale, "suspect_ranks": suspects, "ranks": per_rank,
                "early": early_named, "nccl": memory.nccl}
    title = f"Hang: no progress after step {step - 1}"
    if obs.nodes and suspects:   # a job: which rank on which node, at the step it stopped at
        title = f"Hang: {obs.who(suspects[0])} stopped at step {per_rank[str(suspects[0])]['heartbeat_step']:,}"
    return Incident("hang", "error", step, title, detail, ADVICE_HANG, evidence)


def straggler(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> Incident | None:
    """A rank's heartbeat steadily `straggler_steps` or more behind the most advanced rank."""
    if not running(memory, obs):
        return None
    med = memory.median_step_interval() or 1.0
    steady = max(3.0, 3 * med)
    lagging = {r: lag for r, (lag, since) in memory.heartbeat_lag.items() if obs.now - since >= steady}
    if not lagging:
        return None
    hbs = this_attempt(memory, obs)
    top = max(int(as_float(hb.get("step"))) for hb in hbs.values()) if hbs else None
    worst = max(lagging, key=lambda r: lagging[r])
    detail = (f"{obs.who(worst)} is {lagging[worst]} steps behind the leading rank (step {top}) for over "
              f"{fmt_s(steady)}; " + ", ".join(f"{obs.who(r)}: {_doing(obs.procs.get(r))}" for r in sorted(obs.procs)))
    evidence = {"lag_steps": {str(r): lag for r, lag in lagging.items()}, "leading_step": top,
                "threshold_steps": m.straggler_steps, "steady_s": steady}
    return Incident("straggler", "warn", top, f"Straggler: {obs.who(worst)} behind", detail, ADVICE_STRAGGLER, evidence)


HANG_ENDED = "hang: mt ended the attempt"
