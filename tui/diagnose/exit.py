"""Why a worker exited: crash, oom or nccl_timeout, from exit codes and log tails (pure text)."""
from __future__ import annotations

import dataclasses
import math
import re
import signal
from typing import Any

from mt.contract.config import MonitorConfig
from mt.contract.events import as_float
from mt.contract.incident import Incident
from mt.contract.rollback import RUN_END
from mt.contract.status import CLEAN_STATES
from tui.diagnose.findings import Observation, RankProc
from tui.diagnose.hang import HANG_ENDED, blamed
from tui.diagnose.lost import lost_nodes, node_lost
from tui.diagnose.memory import RuleMemory
from tui.format.fmt import at_step, fmt_rank
from tui.read.torchrun_log import Failure, torchrun_failures

# CUDA's own error (a kernel launch or cudaMalloc outside torch's allocator, e.g. cuBLAS workspace,
# NCCL buffers) reads "CUDA error: out of memory"; NCCL reports it as "Cuda failure 'out of memory'"
# (newer NCCL: "Cuda failure 2 'out of memory'") under an "unhandled cuda error" DistBackendError.
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
                  r"HIP out of memory|std::bad_alloc|\bMemoryError\b|Cannot allocate memory|"
                  r"DefaultCPUAllocator: can't allocate memory|CUDA error: out of memory|"
                  r"Cuda failure (?:\d+ )?'out of memory'")
_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|collective operation timeout|"
                      r"Timed out waiting \d+ ?ms for (?:recv|send)|ProcessGroup\w*.*(?:timed out|Timeout)|"
                      r"NCCL (?:timeout|communicator was aborted)|DistBackendError.*(?:timed out|Timeout)|"
                      r"Socket Timeout", re.I)
_PEER_GONE = re.compile(r"Connection (?:closed|reset) by peer|Broken pipe|ECONNRESET|"
                        r"Connection refused.*(?:gloo|store)|NCCL.*remote process exited", re.I)
# Someone asked the process (or its DataLoader worker) to stop: mt stop/kill, a scheduler, Ctrl-C.
_TERMINATED = re.compile(r"killed by signal: (?:Terminated|Interrupt|Hangup)|^KeyboardInterrupt|"
                         r"Signal (?:15|2|1) \(SIG(?:TERM|INT|HUP)\) received")
_KILLED = re.compile(r"killed by signal: Killed")
_EXC_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure)\b:?.*$")
# A script's own error line with no traceback: argparse's `train.py: error: unrecognized arguments: ...`,
# a `sys.exit("error: ...")`, a tool's `fatal: ...`
_ERROR_LINE = re.compile(r"^(?:\S+: )?(?:error|fatal):\s", re.I)
_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")

# Ways to be asked to stop: nobody's fault, no incident (mt stop/kill, a scheduler, Ctrl-C).
_POLITE = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}

ADVICE = {
    "crash": (
        "Read the last frames of the traceback in the rank's log (logs/rank<N>.log) — the first "
        "rank to die is the cause, the others usually only lost their peer. Fix it and `mt resume` "
        "from the newest checkpoint; a crash at the same step twice points at the data (that "
        "shard) or a code path (eval, checkpoint) rather than the hardware."
    ),
    "oom": (
        "Out of memory. GPU: lower micro_batch_size and raise grad_accum_steps (same global "
        "batch), shorten seq_len, use bf16, enable activation checkpointing, set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; check mem_peak_bytes in the step events. "
        "Host (kernel OOM killer): fewer DataLoader workers or a smaller prefetch_factor, "
        "memory-map the dataset instead of loading it, fewer ranks per node."
    ),
    "nccl_timeout": (
        "A collective timed out or lost its peer: one rank stopped joining (hung, crashed, or "
        "its node went away) or the network failed. Find the rank that stopped first (a hang "
        "incident before this names it), check the network (NCCL_DEBUG=INFO, NCCL_SOCKET_IFNAME, "
        "firewalls), and rank-dependent code paths that skip a collective. [launch] pg_timeout_s "
        "sets how long a collective may wait."
    ),
}


def classify_log(tail: str) -> tuple[str | None, str]:
    """(kind, the line that shows it) for a rank's log tail.

    kind: oom, timeout, peer (lost a peer), terminated (asked to stop), killed (SIGKILL, e.g.
    of a DataLoader worker by the OOM killer), exception, error (a line the script printed as its
    error, no traceback: argparse's), or None when the tail says nothing. The one place a rank's
    error line is found: the exit incident keeps it (evidence `line`), every view quotes that.
    """
    lines = [_PREFIX.sub("", ln).rstrip() for ln in tail.splitlines() if ln.strip()]
    for kind, pattern in (("oom", _OOM), ("timeout", _TIMEOUT)):
        hit = next((ln for ln in reversed(lines) if pattern.search(ln)), None)
        if hit:
            return kind, hit.strip()
    exc = next((ln.strip() for ln in reversed(lines) if _EXC_LINE.match(ln.strip())), None)
    for kind, pattern in (("terminated", _TERMINATED), ("killed", _KILLED), ("peer", _PEER_GONE)):
        if exc and pattern.search(exc):
            return kind, exc
    if exc:
        return "exception", exc
    hit = next((ln for ln in reversed(lines) if _PEER_GONE.search(ln)), None)
    if hit:
        return "peer", hit.strip()
    said = next((ln.strip() for ln in reversed(lines) if _ERROR_LINE.match(ln.strip())), None)
    return ("error", said) if said else (None, "")


def _signal_name(code: int | None) -> tuple[int | None, str | None]:
    """Exit codes torchrun reports as -N (or shells as 128+N) for death by signal N."""
    if code is None:
        return None, None
    num = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if num is None:
        return None, None
    try:
        return num, signal.Signals(num).name
    except ValueError:
        return num, f"signal {num}"


def _host_memory_share(memory: RuleMemory, node: str | None) -> float | None:
    """The newest sample's host memory use (in a job, of `node`'s host: the failed rank's)."""
    for s in reversed(memory.system):
        if node is not None and s.get("node") not in (None, node):
            continue
        host = s.get("host") or {}
        used, total = as_float(host.get("mem_used_bytes")), as_float(host.get("mem_total_bytes"))
        if not math.isnan(used) and not math.isnan(total) and total > 0:
            return used / total
    return None


def _first_failure(obs: Observation) -> tuple[list[Failure], str]:
    """Failed ranks, the first first: from torchrun's report, or the logs."""
    failures = [dataclasses.replace(f, node=obs.node) for f in torchrun_failures(obs.torchrun_log)]
    # a job: this node's torchrun report, then the other nodes' (their supervisors recorded them)
    elsewhere = [f for name, e in sorted(obs.node_exits.items()) if name != obs.node for f in e.failures]
    if elsewhere:
        return failures + elsewhere, "torchrun's reports (first observed failure on each node)"
    if failures:
        return failures, "torchrun's report (first observed failure)"
    rc = obs.status.exit_code
    if obs.status.direct and rc:
        return [Failure(0, rc)], "the worker's exit code"  # one process, started without torchrun
    ranked = []
    for rank, tail in sorted(obs.rank_logs.items()):
        kind, _ = classify_log(tail)
        if kind is not None:
            # a rank that only lost its peer, or is still alive, did not die first
            alive = (obs.procs.get(rank) or RankProc(rank)).alive is not False
            ranked.append((kind == "peer", alive, rank))
    return [Failure(r, None) for _, _, r in sorted(ranked)], "rank logs"


def _worth_explaining(memory: RuleMemory, obs: Observation, exited: bool) -> bool:
    """Whether a worker failed (or is failing) in a way nobody asked for."""
    st = obs.status
    dying = st.state in ("running", "stopping") and (
        obs.fresh_error or any(p.alive is False for p in obs.procs.values()))
    if st.state == "killed" or st.reason == "kill requested" or not (exited or dying):
        return False  # mt kill: a SIGKILL after the grace period is the user's doing, not a crash
    if (st.reason or "").startswith(HANG_ENDED):
        return False  # the supervisor ended a hung attempt: the open hang says why
    if (obs.open_evidence.get("nan_loss") or {}).get("action") == "stop":
        return False  # the engine stopped on purpose, and said why (nan_loss)
    return not (memory.run_end is not None and memory.run_end.status in (*CLEAN_STATES, RUN_END))  # RUN_END: on purpose


def _root_cause(first: Failure, failures: list[Failure], obs: Observation) -> tuple[Failure, str | None, str]:
    """(rank, kind, line): the first failure, unless its log shows only a consequence (a lost
    peer, a stop request) and another rank's log has a cause of its own."""
    kind, line = classify_log(obs.rank_logs.get(first.rank, ""))
    if kind in ("peer", "terminated"):
        for f in failures[1:] + [Failure(r, None) for r in sorted(obs.rank_logs) if r != first.rank]:
            k2, l2 = classify_log(obs.rank_logs.get(f.rank, ""))
            # a rank killed by a signal (kill -9 leaves nothing in its log) is a cause of its own too
            if k2 not in (None, "peer", "terminated") or (k2 is None and (f.exit_code or 0) < 0):
                return f, k2, l2
    return first, kind, line


def _what_happened(kind: str | None, line: str, signum: int | None, signame: str | None,
                   host_mem: float | None, exit_code: Any) -> tuple[str, str]:
    """(incident code, what the rank did) from its log's verdict and how it exited."""
    if kind == "oom":
        return "oom", f"ran out of memory: {line}"
    if kind == "timeout":
        return "nccl_timeout", f"timed out in a collective: {line}"
    if kind == "peer":
        return "nccl_timeout", f"lost its collective peer: {line}"
    if (signum == signal.SIGKILL or kind == "killed") and host_mem is not None and host_mem >= 0.9:
        return "oom", f"was killed by SIGKILL with host memory at {host_mem:.0%}: the kernel's OOM killer"
    if kind == "killed":
        return "crash", f"lost a process to SIGKILL (the kernel's OOM killer, or kill -9): {line}"
    if signame:
        return "crash", f"was killed by {signame}" + (f" ({line})" if line else "") + (
            " (the kernel's OOM killer, or kill -9)" if signum == signal.SIGKILL else "")
    if kind == "exception":
        return "crash", f"raised {line}"
    if kind == "error":
        return "crash", f"exited with code {exit_code}: {line}"
    return "crash", f"exited with code {exit_code}; no traceback in its log"


def _detail(who: str, what: str, source: str, first: Failure, failures: list[Failure],
            code: str, stuck: list[int] | None) -> str:
    detail = f"{who} {what} (first to fail, per {source})"
    others = [f"rank {f.rank}{f' on node {f.node}' if f.node else ''} exit {f.exit_code}" for f in failures if f.rank != first.rank]
    if others:
        detail += "; then " + ", ".join(others)
    if code == "nccl_timeout" and stuck:
        detail += f"; the hang before it pointed at rank {', '.join(map(str, stuck))}"
    return detail


def _title(code: str, step: int | None, who: str, stuck: list[int] | None) -> str:
    if code != "nccl_timeout":
        return f"{'Worker crashed' if code == 'crash' else 'Out of memory'}: {who} {at_step(step)}"
    if stuck:
        return f"Collective timeout {at_step(step)}: rank {', '.join(map(str, stuck))} had stopped"
    return f"Collective timeout {at_step(step)}: {who} gave up waiting"


def worker_exit(memory: RuleMemory, obs: Observation, m: MonitorConfig) -> Incident | None:
    """A worker exited non-zero: classify the first one to die.

    Known for sure once torchrun has exited (status.json has its exit code); before that, a
    rank that has gone, or printed an error since the last step, with a clear cause in its
    log already counts.
    """
    if obs.nodes and obs.status.slurm_state == "NODE_FAIL":
        # Slurm said a node failed: decided from that and the heartbeats, whichever of the node's death,
        # the survivors' errors and Slurm's SIGTERM came first (the survivors' logs may say nothing yet)
        return _node_failed(memory, obs)
    rc = obs.status.exit_code
    if rc in (None, 0) and obs.node_exits:   # a job: a node's torchrun failed before the job's status says so
        rc = obs.node_exits[min(obs.node_exits)].exit_code
    exited = rc not in (None, 0) or obs.status.state == "failed" or bool(obs.node_exits)
    if not _worth_explaining(memory, obs, exited):
        return None
    failures, source = _first_failure(obs)
    first = failures[0] if failures else Failure(-1, rc)
    first, kind, line = _root_cause(first, failures, obs)
    tail = obs.rank_logs.get(first.rank, "")   # the blamed rank's log, not torchrun's first
    signum, signame = _signal_name(first.exit_code)
    if kind == "terminated" or (kind is None and (signum in _POLITE or not exited)):
        return None  # stopped from outside (mt stop/kill, a scheduler): the status says so
    if obs.status.slurm_state == "REQUEUED" and kind in (None, "peer"):
        return None  # Slurm requeued the job: its SIGTERM (KillWait later SIGKILL) ended the ranks, the status says so
    host_mem = _host_memory_share(memory, first.node or obs.nodes.get(first.rank))
    code, what = _what_happened(kind, line, signum, signame, host_mem,
                                first.exit_code if first.exit_code is not None else rc)
    # the steps the rules hold are this attempt's only once its run_start came (a factory that
    # raises, or a script that reports nothing, never writes one): else no step ran, none is named
    last = memory.last_step if obs.status.attempt in (None, memory.attempt) else None
    step = last.step + 1 if last else None
    node = first.node or obs.nodes.get(first.rank)   # its supervisor reported it, or its heartbeat is in that node's folder
    who = fmt_rank(first.rank, node) if first.rank >= 0 else "a worker"
    stuck = blamed(obs.open_evidence.get("hang") or {})   # on NCCL its stacks, never a spinning rank
    evidence: dict[str, Any] = {
        "rank": first.rank if first.rank >= 0 else None, "node": node, "exit_code": first.exit_code, "pid": first.pid,
        "signal": signame, "line": line or None, "source": source, "torchrun_exit_code": rc,
        "failures": [{"rank": f.rank, "exit_code": f.exit_code, "pid": f.pid, **({"node": f.node} if f.node else {})}
                     for f in failures],
        "log_tail": [ln for ln in tail.splitlines() if ln.strip()][-8:], "host_mem_share": host_mem,
        "last_step": last.step if last else None,
    }
    if kind in ("peer", "timeout") and obs.nodes:
        # a job's survivor that lost its peer: a node that went away first is the cause, named instead
        said = {r: classify_log(t)[0] for r, t in obs.rank_logs.items()}
        quiet = lost_nodes(memory, obs, node, said)
        if quiet.lost:
            survivor = {"rank": first.rank, "node": node, "kind": kind, "line": line or None}
            return node_lost(quiet.lost, quiet.others_t, step, who, what, {**evidence, "survivor": survivor})
        if quiet.waiting:
            return None   # lost, or its supervisor is about to record the failure: a later tick says which
    return Incident(code, "error", step, _title(code, step, who, stuck),
                    _detail(who, what, source, first, failures, code, stuck), ADVICE[code], evidence)


def _node_failed(memory: RuleMemory, obs: Observation) -> Incident | None:
    """The node Slurm's NODE_FAIL took, found by its heartbeats (stopped first, nothing recorded); the
    job's node (this supervisor's) and its first rank are the survivor. None until the node is told apart."""
    said = {r: classify_log(t)[0] for r, t in obs.rank_logs.items()}
    quiet = lost_nodes(memory, obs, obs.node, said)
    if not quiet.lost:
        return None
    mine = sorted(r for r, n in obs.nodes.items() if n == obs.node) or [-1]
    rank = next((r for r in mine if said.get(r) in ("peer", "timeout")), mine[0])
    kind, line = classify_log(obs.rank_logs.get(rank, ""))
    what = {"peer": f"lost its collective peer: {line}", "timeout": f"timed out in a collective: {line}"}.get(
        kind or "", "was stopped by Slurm (NODE_FAIL: it ends the job's tasks on the other nodes)")
    last = memory.last_step if obs.status.attempt in (None, memory.attempt) else None
    step = last.step + 1 if last else None
    who = fmt_rank(rank, obs.node) if rank >= 0 else f"node {obs.node}"
    evidence: dict[str, Any] = {"torchrun_exit_code": obs.status.exit_code, "last_step": last.step if last else None,
                                "slurm_state": "NODE_FAIL", "failures": [],
                                "survivor": {"rank": rank if rank >= 0 else None, "node": obs.node, "kind": kind, "line": line or None}}
    return node_lost(quiet.lost, quiet.others_t, step, who, what, evidence)
