"""Throughput rules: dataloader stall, throughput drop, GPU memory pressure."""
from __future__ import annotations

import statistics

from engine.config import MonitorConfig
from engine.events import as_float
from tui.diagnose_signals import RunSignals, StepRec
from tui.diagnose_types import Finding, Observation, fmt_s

LIVE_STATES = ("starting", "running", "stopping")

ADVICE_STALL = (
    "The accelerator is waiting for input. First raise [data] num_workers (one to a few per "
    "GPU) and keep pin_memory on; tokenize offline into one flat token file instead of "
    "tokenizing on the fly; avoid many small-file reads (pack into shards) and prefetch shards "
    "(prefetch_factor, local copies of remote data). Watch data_wait_s per step fall."
)
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


def _live(sig: RunSignals, obs: Observation) -> bool:
    state = obs.status.get("state")
    return sig.run_end is None and (state is None or state in LIVE_STATES)


def _nan(x: float) -> bool:
    return x != x


def _gpu_util(sig: RunSignals, obs: Observation, window_s: float) -> float | None:
    """Mean GPU utilisation over the window, if NVML sampled it for (most of) the window."""
    samples = [s for s in sig.recent_system(obs.now, window_s) if s.get("nvml") and s.get("gpus")]
    utils = []
    for s in samples:
        vals = [as_float(g.get("util_pct")) for g in s["gpus"]]
        vals = [v for v in vals if not _nan(v)]
        if vals:
            utils.append((as_float(s.get("t")), sum(vals) / len(vals)))
    if len(utils) < 2 or utils[-1][0] - utils[0][0] < 0.8 * window_s:
        return None
    return sum(u for _, u in utils) / len(utils)


def _stall_window(sig: RunSignals, steps: list[StepRec], end: int, m: MonitorConfig) -> list[StepRec]:
    """The last `stall_steps` judged steps up to index `end`, within stall_window_s of it."""
    recent: list[StepRec] = []
    t_end = steps[end].t
    for r in reversed(steps[: end + 1]):
        if t_end - r.t > m.stall_window_s or len(recent) == m.stall_steps:
            break
        if sig.judged(r) and not _nan(r.data_wait_s) and not _nan(r.step_time_s):
            recent.append(r)
    recent.reverse()
    return recent


def dataloader_stall(sig: RunSignals, obs: Observation, m: MonitorConfig) -> Finding | None:
    """Data wait a large share of recent step time (and, with NVML, GPUs idle meanwhile)."""
    if not _live(sig, obs) or not sig.steps:
        return None
    # Fast runs log many steps between two polls: judge the window ending at each new step,
    # or a stall that has already scrolled out of the last few steps would go unseen.
    tail = list(sig.steps)[-(min(obs.new_steps, 500) + 4 * m.stall_steps):]
    ends = range(max(0, len(tail) - max(1, obs.new_steps)), len(tail))
    ends = [i for i in ends if obs.now - tail[i].t <= m.stall_window_s]
    gpu = _gpu_util(sig, obs, m.stall_window_s)
    gpu_idle = gpu is not None and gpu <= m.stall_gpu_util_pct
    # Without NVML (CPU runs) the data-wait share decides alone; with it, idle GPUs lower the
    # bar to half the share (the GPU confirms what the share suggests).
    need = m.stall_data_share / 2 if gpu_idle else m.stall_data_share
    for end in ends:
        recent = _stall_window(sig, tail, end, m)
        finding = _stall_finding(sig, recent, need, gpu, m)
        if finding is not None:
            return finding
    return None


def _stall_finding(sig: RunSignals, recent: list[StepRec], need: float, gpu: float | None,
                   m: MonitorConfig) -> Finding | None:
    if len(recent) < min(2, m.stall_steps):
        return None
    wait = sum(r.data_wait_s for r in recent)
    total = sum(max(r.step_time_s, r.data_wait_s) for r in recent)
    share = wait / total if total > 0 else 0.0
    if share < need or wait < m.stall_min_wait_s:
        return None
    first = next((r for r in recent if r.data_wait_s >= need * max(r.step_time_s, r.data_wait_s)), recent[0])
    n = len(recent)
    gpu_txt = f"GPU utilisation averaged {gpu:.0f}% over the last {fmt_s(m.stall_window_s)} while " if gpu is not None else ""
    detail = (f"{gpu_txt}data wait was {share:.0%} of step time over steps {recent[0].step}-{recent[-1].step}: "
              f"each step waited {fmt_s(wait / n)} for data of {fmt_s(total / n)}")
    if sig.facts.num_workers is not None:
        detail += f" ([data] num_workers = {sig.facts.num_workers})"
    evidence = {
        "steps": [r.step for r in recent], "data_wait_s": [round(r.data_wait_s, 4) for r in recent],
        "step_time_s": [round(r.step_time_s, 4) for r in recent], "data_share": round(share, 3),
        "threshold_share": need, "gpu_util_pct": None if gpu is None else round(gpu, 1),
        "num_workers": sig.facts.num_workers,
    }
    return Finding("dataloader_stall", "warn", first.step, f"Dataloader stall at step {first.step}",
                   detail, ADVICE_STALL, evidence)


def _tps_ok(r: StepRec) -> bool:
    return not _nan(r.tokens_per_s) and r.tokens_per_s > 0


def _time_weighted_median(steps: list[StepRec]) -> float:
    """The rate the run had for half of the time: many fast steps do not outvote slow minutes."""
    pairs = sorted((r.tokens_per_s, r.step_time_s if r.step_time_s > 0 else 0.0) for r in steps)
    total = sum(w for _, w in pairs)
    if total <= 0:
        return statistics.median(v for v, _ in pairs)
    acc = 0.0
    for value, w in pairs:
        acc += w
        if acc >= total / 2:
            return value
    return pairs[-1][0]


def throughput_drop(sig: RunSignals, obs: Observation, m: MonitorConfig) -> Finding | None:
    """Tokens/s well below the run's own median for a sustained window (pauses excluded)."""
    if not _live(sig, obs):
        return None
    recent: list[StepRec] = []
    before: list[StepRec] = []
    for r in reversed(sig.steps):  # newest first; the baseline is the last 500 steps before
        if len(before) == 500:
            break
        if sig.judged(r) and _tps_ok(r):
            (recent if obs.now - r.t <= m.throughput_window_s else before).append(r)
    recent.reverse()
    if len(recent) < 3 or len(before) < 10:
        return None
    # Sustained: the low rate must cover most of the window, not just its last seconds.
    if recent[-1].t - recent[0].t < 0.5 * m.throughput_window_s:
        return None
    base = statistics.median(r.tokens_per_s for r in before)
    now_rate = _time_weighted_median(recent)
    if now_rate >= m.throughput_drop_share * base:
        return None
    first = next((r for r in recent if r.tokens_per_s < m.throughput_drop_share * base), recent[0])
    wait = statistics.median(r.data_wait_s for r in recent if not _nan(r.data_wait_s)) if recent else None
    detail = (f"tokens/s fell to {now_rate:,.0f} (time-weighted median of the last {fmt_s(m.throughput_window_s)}, "
              f"{len(recent)} steps) from {base:,.0f} before, {now_rate / base:.0%} of it; "
              f"median step time {fmt_s(statistics.median(r.step_time_s for r in recent))}, data wait {fmt_s(wait)}")
    evidence = {"tokens_per_s_now": round(now_rate, 1), "tokens_per_s_before": round(base, 1),
                "ratio": round(now_rate / base, 3), "steps": [recent[0].step, recent[-1].step],
                "threshold_share": m.throughput_drop_share, "data_wait_s_median": wait}
    return Finding("throughput_drop", "warn", first.step, f"Throughput drop from step {first.step}",
                   detail, ADVICE_THROUGHPUT, evidence)


def memory_pressure(sig: RunSignals, obs: Observation, m: MonitorConfig) -> Finding | None:
    """A GPU's memory above the share of its total for the whole window."""
    if not _live(sig, obs):
        return None
    samples = [s for s in sig.recent_system(obs.now, m.memory_window_s) if s.get("nvml") and s.get("gpus")]
    if len(samples) < 2 or as_float(samples[-1].get("t")) - as_float(samples[0].get("t")) < 0.8 * m.memory_window_s:
        return None
    shares: dict[int, list[float]] = {}
    totals: dict[int, float] = {}
    for s in samples:
        for g in s["gpus"]:
            used, total = as_float(g.get("mem_used_bytes")), as_float(g.get("mem_total_bytes"))
            if _nan(used) or _nan(total) or total <= 0:
                continue
            idx = int(g.get("index", 0))
            shares.setdefault(idx, []).append(used / total)
            totals[idx] = total
    full = {i: v for i, v in shares.items() if len(v) >= 2 and min(v) >= m.memory_pressure_share}
    if not full:
        return None
    worst = max(full, key=lambda i: max(full[i]))
    last = sig.last_step
    gpus = ", ".join(f"GPU {i} {max(v):.1%}" for i, v in sorted(full.items()))
    detail = (f"GPU memory above {m.memory_pressure_share:.0%} of total for the last "
              f"{fmt_s(m.memory_window_s)}: {gpus} (of {totals[worst] / 2**30:.0f} GiB)")
    evidence = {"gpus": {str(i): {"min_share": round(min(v), 4), "max_share": round(max(v), 4)} for i, v in full.items()},
                "window_s": m.memory_window_s, "threshold_share": m.memory_pressure_share}
    return Finding("memory_pressure", "warn", last.step if last else None, "GPU memory pressure",
                   detail, ADVICE_MEMORY, evidence)
