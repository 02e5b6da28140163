"""Throughput rules: throughput drop, GPU memory pressure (and helpers the stall rule shares)."""
from __future__ import annotations

import math
import statistics
from typing import Any

from mt.contract.config import MonitorConfig
from mt.contract.events import as_float
from mt.contract.incident import Incident
from tui.diagnose.findings import Observation
from tui.diagnose.memory import RuleMemory, StepRec
from tui.format.fmt import fmt_gib, fmt_s

ADVICE_THROUGHPUT = (
    "Compare data_wait_s, step_time_s and GPU utilisation around the drop: a rising data wait "
    "is the input pipeline, a slower step with busy GPUs is thermal/clock throttling or "
    "another job on the GPU, slow steps with idle GPUs on one rank is a straggler or the "
    "network. Check the host (CPU, memory, swap) and other processes first."
)
ADVICE_MEMORY = (
    "Close to out-of-memory: the next longer sequence or an allocator fragment can fail the "
    "run. Lower micro_batch_size and raise grad_accum_steps (same global batch), use bf16, "
    "enable activation checkpointing, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "to reduce fragmentation."
)


def is_live(memory: RuleMemory, obs: Observation) -> bool:
    """The run is (still) going: no run_end for this attempt, and status.json says it lives."""
    return memory.run_end is None and obs.live


def gpu_util(memory: RuleMemory, obs: Observation, window_s: float) -> float | None:
    """Mean GPU utilisation over the window, if NVML sampled it for (most of) the window."""
    samples = [s for s in memory.recent_system(obs.now, window_s) if s.get("nvml") and s.get("gpus")]
    utils = []
    for s in samples:
        vals = [as_float(g.get("util_pct")) for g in s["gpus"]]
        vals = [v for v in vals if not math.isnan(v)]
        if vals:
            utils.append((as_float(s.get("t")), sum(vals) / len(vals)))
    if len(utils) < 2 or utils[-1][0] - utils[0][0] < 0.8 * window_s:
        return None
    return sum(u for _, u in utils) / len(utils)


def _tps_ok(r: StepRec) -> bool:
    return not math.isnan(r.tokens_per_s) and r.tokens_per_s > 0


def _weight(r: StepRec) -> float:
    """The wall time a step held the run (its interval; its step time when that is unknown)."""
    w = r.interval_s if not math.isnan(r.interval_s) else r.step_time_s
    return w if w > 0 else 0.0


def _time_weighted_median(steps: list[StepRec]) -> float:
    """The rate the run had for half of the time: many fast steps do not outvote slow minutes."""
    pairs = sorted((r.tokens_per_s, _weight(r)) for r in steps)
    total = sum(w for _, w in pairs)
    if total <= 0:
        return statistics.median(v for v, _ in pairs)
    acc = 0.0
    for value, w in pairs:
        acc += w
        if acc >= total / 2:
            return value
    return pairs[-1][0]


def _host_view(memory: RuleMemory, obs: Observation) -> tuple[dict[str, Any], str]:
    """The newest system sample's host load and rank CPU, and a sentence when the host is oversubscribed."""
    sample = memory.newest_system(obs.node)   # in a job, the job's node's host: the one this monitor runs on
    if sample is None or obs.now - as_float(sample.get("t")) > 10:
        return {}, ""
    h = sample.get("host") or {}
    load, cpu = as_float(h.get("load1")), as_float(h.get("cpu_pct"))
    ranks = [as_float(r.get("cpu_pct")) for r in sample.get("ranks") or [] if isinstance(r, dict)]
    view = {"load1": None if math.isnan(load) else round(load, 2), "cpu_pct": None if math.isnan(cpu) else cpu,
            "cores": memory.facts.host_cores, "rank_cpu_pct": [None if math.isnan(c) else c for c in ranks]}
    cores = memory.facts.host_cores
    if cores and not math.isnan(load) and load > 1.5 * cores:
        shown = ", ".join(f"{c:.0f}%" for c in ranks if not math.isnan(c))
        return view, (f"; the host is oversubscribed: load {load:.1f} on {cores} cores"
                      + (f", the ranks get {shown} CPU" if shown else "") + " (other processes compete)")
    return view, ""


def throughput_drop(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> Incident | None:
    """Tokens/s well below the run's own median for a sustained window (pauses excluded)."""
    if not is_live(memory, obs):
        return None
    recent: list[StepRec] = []
    before: list[StepRec] = []
    for r in reversed(memory.steps):  # newest first; the baseline is the last 500 steps before
        if len(before) == 500:
            break
        # steps that mostly waited for data are the stall rule's; they would only echo it here
        data_bound = not math.isnan(r.data_wait_s) and r.data_wait_s >= m.stall_data_share * max(r.step_time_s, 1e-9)
        if memory.judged(r) and _tps_ok(r) and not data_bound:
            (recent if obs.now - r.t <= m.throughput_window_s else before).append(r)
    recent.reverse()
    if len(recent) < 3 or len(before) < 10:
        return None
    # Sustained: the low rate must cover most of the window, not just its last seconds.
    if recent[-1].t - recent[0].t < 0.5 * m.throughput_window_s:
        return None
    base = statistics.median(r.tokens_per_s for r in before)
    now_rate = _time_weighted_median(recent)
    slow = [r for r in recent if r.tokens_per_s < m.throughput_drop_share * base]
    if now_rate >= m.throughput_drop_share * base or len(slow) < 3:
        return None  # one long step, however long, is a hiccup (or a hang), not a lower rate
    first = slow[0]
    wait = statistics.median(r.data_wait_s for r in recent if not math.isnan(r.data_wait_s)) if recent else None
    detail = (f"tokens/s fell to {now_rate:,.0f} (time-weighted median of the last {fmt_s(m.throughput_window_s)}, "
              f"{len(recent)} steps) from {base:,.0f} before, {now_rate / base:.0%} of it; "
              f"median step time {fmt_s(statistics.median(r.step_time_s for r in recent))}, data wait {fmt_s(wait)}")
    host, host_txt = _host_view(memory, obs)
    detail += host_txt
    evidence = {"tokens_per_s_now": round(now_rate, 1), "tokens_per_s_before": round(base, 1),
                "ratio": round(now_rate / base, 3), "steps": [recent[0].step, recent[-1].step],
                "threshold_share": m.throughput_drop_share, "data_wait_s_median": wait, "host": host}
    return Incident("throughput_drop", "warn", first.step, f"Throughput drop from step {first.step}",
                    detail, ADVICE_THROUGHPUT, evidence)


def memory_pressure(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> Incident | None:
    """A rank's per-step peak of allocated memory (PyTorch's allocator, its heartbeat) above the share of its
    GPU's total for the whole window. NVML's "used" is not judged: it counts the allocator's cache, the CUDA
    context and NCCL's buffers, where a healthy, well-packed run sits at 95%."""
    if not is_live(memory, obs):
        return None
    samples = [s for s in memory.recent_system(obs.now, m.memory_window_s) if s.get("ranks")]
    if len(samples) < 2 or as_float(samples[-1].get("t")) - as_float(samples[0].get("t")) < 0.8 * m.memory_window_s:
        return None
    shares: dict[int, list[float]] = {}
    last: dict[int, dict[str, Any]] = {}
    per_node: dict[Any, int] = {}   # a job's nodes each sample their own ranks
    node_of: dict[int, Any] = {}
    for s in samples:
        per_node[s.get("node")] = per_node.get(s.get("node"), 0) + 1
        for r in s["ranks"]:
            node_of[r["rank"]] = s.get("node")
            peak, total = as_float(r.get("mem_peak_bytes")), as_float(r.get("mem_total_bytes"))
            if math.isnan(peak) or math.isnan(total) or total <= 0:
                continue
            shares.setdefault(r["rank"], []).append(peak / total)
            last[r["rank"]] = r
    # every sample of the window: a rank that reported in only some of them is not judged on the rest
    full = {r: v for r, v in shares.items() if len(v) == per_node[node_of[r]] and min(v) >= m.memory_pressure_share}
    if not full:
        return None
    step = memory.last_step
    ranks = ", ".join(f"{obs.who(r)} {max(v):.1%} (allocated {fmt_gib(last[r].get('mem_alloc_bytes'))}, "
                      f"reserved {fmt_gib(last[r].get('mem_reserved_bytes'))} of "
                      f"{fmt_gib(last[r].get('mem_total_bytes'))} GiB)" for r, v in sorted(full.items()))
    detail = (f"the per-step peak of allocated memory (PyTorch's allocator) above {m.memory_pressure_share:.0%} "
              f"of the GPU's memory for the last {fmt_s(m.memory_window_s)}: {ranks}. NVML's used memory is not "
              "judged: it counts the allocator's cache, the CUDA context and NCCL's buffers")
    evidence = {"ranks": {str(r): {"min_share": round(min(v), 4), "max_share": round(max(v), 4),
                                   **{k: last[r].get(k) for k in ("gpu", "mem_alloc_bytes", "mem_reserved_bytes",
                                                                  "mem_peak_bytes", "mem_total_bytes")},
                                   **({"node": obs.nodes[r]} if r in obs.nodes else {})} for r, v in full.items()},
                "window_s": m.memory_window_s, "threshold_share": m.memory_pressure_share}
    return Incident("memory_pressure", "warn", step.step if step else None, "GPU memory pressure",
                    detail, ADVICE_MEMORY, evidence)
