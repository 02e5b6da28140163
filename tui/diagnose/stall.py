"""dataloader_stall: the input pipeline, not the model, is what the steps wait for."""
from __future__ import annotations

import math

from mt.contract.config import MonitorConfig
from mt.contract.incident import Incident
from tui.diagnose.findings import WAITING_SYSCALLS, ChildProc, Observation, RankProc
from tui.diagnose.hang import last_progress, running
from tui.diagnose.memory import WARMUP_STEPS, RuleMemory, StepRec
from tui.diagnose.perf import gpu_util, is_live
from tui.format.fmt import fmt_s

ADVICE_STALL = (
    "The accelerator is waiting for input. First raise [data] num_workers (one to a few per "
    "GPU) and keep pin_memory on; tokenize offline into one flat token file instead of "
    "tokenizing on the fly; avoid many small-file reads (pack into shards) and prefetch shards "
    "(prefetch_factor, local copies of remote data). Watch data_wait_s per step fall."
)


def _stall_window(memory: RuleMemory, steps: list[StepRec], end: int, m: MonitorConfig) -> list[StepRec]:
    """The last `stall_steps` judged steps up to index `end`, within stall_window_s of it."""
    recent: list[StepRec] = []
    t_end = steps[end].t
    for r in reversed(steps[: end + 1]):
        if t_end - r.t > m.stall_window_s or len(recent) == m.stall_steps:
            break
        if memory.judged(r) and not math.isnan(r.data_wait_s) and not math.isnan(r.step_time_s):
            recent.append(r)
    recent.reverse()
    return recent


# Children that are not DataLoader workers: torch.compile's worker pool compiles while the
# rank waits for it, which is start-up cost, not input.
_NOT_LOADERS = ("compile_worker", "_inductor", "triton")


def _busy(c: ChildProc) -> bool:
    """A DataLoader worker doing something (reading, decoding, sleeping) rather than idling on its queue."""
    if any(tag in c.cmdline for tag in _NOT_LOADERS):
        return False
    return c.state in ("R", "D") or (c.syscall is not None and c.syscall not in WAITING_SYSCALLS)


def _waiting(p: RankProc) -> bool:
    """Blocked on its input queue; a waiting loop wakes now and then, so a moment on the CPU
    by an otherwise idle process (under 10% CPU) still counts as waiting."""
    if p.syscall in WAITING_SYSCALLS:
        return True
    return p.syscall == "running" and p.cpu_pct is not None and p.cpu_pct < 10.0


def stall_in_progress(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> Incident | None:
    """No step for a while, every rank blocked on its input queue while its DataLoader workers work.

    Seen from /proc while the stalled step is still waiting, so a long stall is named for what
    it is within seconds instead of being taken for a hang when its step finally lands.
    """
    last = memory.last_step
    if not running(memory, obs) or last is None or last.step <= memory.start_step + WARMUP_STEPS:
        return None
    if memory.pauses_due(last.step):
        return None  # an eval or checkpoint runs now: waiting ranks are expected
    progress = last_progress(memory, obs)
    interval = memory.median_step_interval() or 0.0
    idle = obs.now - progress if progress is not None else 0.0
    if idle < max(3.0, m.stall_min_wait_s, 3 * interval):
        return None
    blocked = _blocked_on_input(obs)
    if blocked is None:
        return None
    alive, feeding = blocked
    step = last.step + 1
    workers = "; ".join(f"{obs.who(r)}: waits in {alive[r].syscall}, worker "
                        + ", ".join(f"{c.pid} {'in ' + c.syscall if c.syscall else c.state}" for c in cs)
                        for r, cs in sorted(feeding.items()))
    detail = (f"no step for {fmt_s(idle)} after step {last.step} (steps take {fmt_s(interval)}): every rank "
              f"is blocked waiting for its next batch while its DataLoader workers are still busy ({workers})")
    if memory.facts.num_workers is not None:
        detail += f"; [data] num_workers = {memory.facts.num_workers}"
    evidence = {"idle_s": round(idle, 1), "median_step_interval_s": interval, "in_progress": True,
                "ranks": {str(r): {"syscall": p.syscall, "workers": [{"pid": c.pid, "state": c.state, "syscall": c.syscall}
                                                                      for c in p.children]} for r, p in alive.items()},
                "num_workers": memory.facts.num_workers}
    return Incident("dataloader_stall", "warn", step, f"Dataloader stall at step {step}", detail, ADVICE_STALL, evidence)


def _blocked_on_input(obs: Observation) -> tuple[dict[int, RankProc], dict[int, list[ChildProc]]] | None:
    """(live ranks, their busy DataLoader workers) when every live rank waits on its input queue
    while some of its workers work; None otherwise (a rank computes, sleeps, or cannot be read)."""
    # another node's ranks as that node sampled them (system call and workers); a rank whose sample
    # has no system call (an older writer) cannot be judged, and the ranks that can be decide
    alive = {r: p for r, p in obs.procs.items() if p.alive and (not p.remote or p.syscall is not None)}
    if not alive or not all(_waiting(p) for p in alive.values()):
        return None
    feeding = {r: [c for c in p.children if _busy(c)] for r, p in alive.items()}
    feeding = {r: cs for r, cs in feeding.items() if cs}
    return (alive, feeding) if feeding else None


NCCL_BUSY = ("NCCL's kernels spin while they wait, so a GPU whose rank waits in a collective for a starved rank "
             "reads busy: the utilisation understates the stall")


def silent_stall(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> Incident | None:
    """A script that reports nothing through mt has no steps to judge: its ranks all blocked on
    their input queues while their DataLoader workers work, for stall_window_s (with NVML, the
    GPUs idle too: a rank waiting on its GPU looks alike), seen from /proc alone."""
    blocked = _blocked_on_input(obs) if memory.facts.script and memory.attempt is None and \
        obs.status.state == "running" else None
    gpu = gpu_util(memory, obs, m.stall_window_s) if blocked else None
    if blocked is None or (gpu is not None and gpu > m.stall_gpu_util_pct):
        memory.blocked_on_input_since = None
        return None
    since = memory.blocked_on_input_since = memory.blocked_on_input_since or obs.now
    if obs.now - since < m.stall_window_s / 2:
        return None
    alive, feeding = blocked
    workers = "; ".join(f"{obs.who(r)}: waits in {alive[r].syscall}, worker "
                        + ", ".join(f"{c.pid} {'in ' + c.syscall if c.syscall else c.state}" for c in cs)
                        for r, cs in sorted(feeding.items()))
    detail = (f"for {fmt_s(obs.now - since)} every rank has been blocked waiting for its next batch while its "
              f"DataLoader workers are busy ({workers}); the script reports no steps (run.step), so this is "
              f"seen from the processes alone")
    evidence = {"blocked_s": round(obs.now - since, 1), "in_progress": True, "gpu_util_pct": gpu,
                "ranks": {str(r): {"syscall": p.syscall, "workers": [{"pid": c.pid, "state": c.state, "syscall": c.syscall}
                                                                      for c in p.children]} for r, p in alive.items()}}
    return Incident("dataloader_stall", "warn", None, "Dataloader stall (seen from the processes)", detail,
                    ADVICE_STALL, evidence)


def dataloader_stall(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> Incident | None:
    """Data wait a large share of recent step time (and, with NVML, GPUs idle meanwhile)."""
    silent = silent_stall(memory, obs, m)
    if silent is not None or memory.facts.script and memory.attempt is None:
        return silent
    if not is_live(memory, obs) or not memory.steps:
        return None
    ongoing = stall_in_progress(memory, obs, m)
    if ongoing is not None:
        return ongoing
    # Fast runs log many steps between two polls: judge the window ending at each new step,
    # or a stall that has already scrolled out of the last few steps would go unseen.
    tail = list(memory.steps)[-(min(obs.new_steps, 500) + 4 * m.stall_steps):]
    ends = range(max(0, len(tail) - max(1, obs.new_steps)), len(tail))
    ends = [i for i in ends if obs.now - tail[i].t <= m.stall_window_s]
    gpu = gpu_util(memory, obs, m.stall_window_s)
    gpu_idle = gpu is not None and gpu <= m.stall_gpu_util_pct
    # Without NVML (CPU runs) the data-wait share decides alone; with it, idle GPUs lower the
    # bar to half the share (the GPU confirms what the share suggests).
    need = m.stall_data_share / 2 if gpu_idle else m.stall_data_share
    for end in ends:
        recent = _stall_window(memory, tail, end, m)
        finding = _stall_finding(memory, recent, need, gpu, m)
        if finding is not None:
            return finding
    return None


def _stall_finding(memory: RuleMemory, recent: list[StepRec], need: float, gpu: float | None,
                   m: MonitorConfig) -> Incident | None:
    """The incident for one window of steps, if their data wait is `need` of their time."""
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
    worst = max(recent, key=lambda r: r.data_wait_s)
    detail = (f"{gpu_txt}data wait was {share:.0%} of step time over steps {recent[0].step}-{recent[-1].step} "
              f"({fmt_s(wait / n)} of {fmt_s(total / n)} per step; step {worst.step} waited "
              f"{fmt_s(worst.data_wait_s)} of its {fmt_s(max(worst.step_time_s, worst.data_wait_s))})")
    if memory.facts.num_workers is not None:
        detail += f" ([data] num_workers = {memory.facts.num_workers})"
    if gpu is not None and memory.nccl:
        detail += f"; {NCCL_BUSY}"
    evidence = {
        "steps": [r.step for r in recent], "data_wait_s": [round(r.data_wait_s, 4) for r in recent],
        "step_time_s": [round(r.step_time_s, 4) for r in recent], "data_share": round(share, 3),
        "threshold_share": need, "gpu_util_pct": None if gpu is None else round(gpu, 1),
        "num_workers": memory.facts.num_workers,
    }
    return Incident("dataloader_stall", "warn", first.step, f"Dataloader stall at step {first.step}",
                    detail, ADVICE_STALL, evidence)


