"""Talk to a live run: drop control requests, wait for the engine's answer, kill the run.

Used by `mt ckpt` / `mt stop` / `mt kill` and by the dashboard's c / s / k keys.
"""
from __future__ import annotations

import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mt.events import CONTROL_ACTIONS, FINAL_STATES
from mt.jsonl import read_json, write_json_atomic
from mt.paths import RunPaths
from mt.records import Checkpoint, ControlEvent, RecordTail
from tui.rundir import NotARunError, liveness, read_status, require_run_dir


class ControlError(RuntimeError):
    """The request cannot be made (not a run, run not live, unknown action)."""


class NotReporting(ControlError):
    """Nobody reads control/: the run's script has not called run.step in this attempt."""


@dataclass
class Answer:
    """The engine's answer: status is done, rejected, timeout or ended (the run ended first)."""

    request_id: str
    action: str
    status: str
    detail: str = ""
    checkpoint: Checkpoint | None = None
    """The `checkpoint` event written for this request (checkpoint action), if any."""


@dataclass
class KillResult:
    """What kill_run did; `survivors` is empty when no process of the run is left."""

    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    state: str = "killed"


def _require_live(run_dir: Path) -> dict[str, Any]:
    run_dir = require_run_dir(run_dir)
    status = read_status(run_dir)
    live = liveness(status)
    if live == "final":
        raise ControlError(f"{run_dir}: the run has already ended ({status.get('state')})")
    if live == "lost":
        raise ControlError(f"{run_dir}: the run is not running (its supervisor is gone)")
    return status


def takes_requests(run_dir: Path, status: dict[str, Any]) -> bool:
    """Whether the run reads control/: mt's engine does, a script once it calls run.step (rank
    0's heartbeat thread polls it from then on); a heartbeat of this attempt says it did."""
    from tui.diagnose.probes import read_heartbeats

    paths = RunPaths(Path(run_dir))
    raw = read_json(paths.config)
    launch = raw.get("launch") if isinstance(raw, dict) else None
    if not (isinstance(launch, dict) and launch.get("script")) or status.get("owner") == "script":
        return True  # the engine, or a run mt.init made (its rank 0 is the script, which uses mt)
    return any(hb.get("attempt") == status.get("attempt") for hb in read_heartbeats(paths).values())


def not_reporting_line(run_dir: Path, action: str) -> str:
    """Why a bare script cannot take `action` through control/, and what would let it."""
    return (f"{run_dir}: {action} now needs run.step: the script reports nothing through mt in this attempt "
            "(`run = mt.init()`, then `run.step(step, ...)` in its loop; docs/library.md)")


def send_request(run_dir: Path, action: str) -> str:
    """Write `control/<id>.json` atomically for the engine to pick up; returns the request id.

    NotReporting when nobody would read it (a script that has not called run.step)."""
    if action not in CONTROL_ACTIONS:
        raise ControlError(f"unknown action {action!r} (known: {', '.join(CONTROL_ACTIONS)})")
    run_dir = Path(run_dir)
    status = _require_live(run_dir)
    if not takes_requests(run_dir, status):
        raise NotReporting(not_reporting_line(run_dir, action))
    request_id = f"{action[:4]}-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:8]}"
    paths = RunPaths(run_dir)
    paths.control.mkdir(mode=0o700, exist_ok=True)
    write_json_atomic(paths.control / f"{request_id}.json", {"id": request_id, "action": action, "t": time.time()})
    return request_id


def request_stop(run_dir: Path) -> str | None:
    """A graceful stop: a `stop` request (its id), or, for a script that reports nothing through
    mt, SIGTERM to its supervisor (None), which forwards it and records `stopped`."""
    try:
        return send_request(run_dir, "stop")
    except NotReporting:
        from tui.run.procs import run_process

        status = read_status(Path(run_dir))
        pid = status.get("supervisor_pid")
        sup = run_process(pid, Path(run_dir)) if isinstance(pid, int) and not isinstance(pid, bool) else None
        if sup is None:
            raise ControlError(f"{run_dir}: the run is not running (its supervisor is gone)") from None
        sup.send_signal(signal.SIGTERM)
        return None


def wait_answer(run_dir: Path, request_id: str, timeout: float) -> Answer:
    """Follow events.jsonl until the engine answers request_id (done/rejected) or timeout.

    A checkpoint request counts as answered once both its `done` control event and its
    `checkpoint` event are there. If the run ends first, status is `ended`.
    """
    paths = RunPaths(Path(run_dir))
    tail = RecordTail(paths.events)
    answer = Answer(request_id=request_id, action="", status="timeout")
    deadline = time.monotonic() + timeout
    while True:
        for ev in tail.iter_new():
            if isinstance(ev, Checkpoint) and request_id in ev.request_ids:
                answer.checkpoint = ev
            elif isinstance(ev, ControlEvent) and ev.request_id == request_id:
                answer.action = ev.action or answer.action
                if ev.status in ("done", "rejected"):
                    answer.status, answer.detail = ev.status, ev.detail
                elif answer.status == "timeout":
                    answer.detail = ev.detail
        if answer.status == "rejected":
            return answer
        if answer.status == "done" and (answer.action != "checkpoint" or answer.checkpoint is not None):
            return answer
        if time.monotonic() >= deadline:
            return answer
        status = read_status(paths.root)
        if liveness(status) in ("final", "lost"):
            for ev in tail.iter_new():  # the answer may have landed just before the end
                if isinstance(ev, Checkpoint) and request_id in ev.request_ids:
                    answer.checkpoint = ev
            if answer.status == "timeout":
                answer.status, answer.detail = "ended", f"the run ended ({status.get('state')}) before answering"
            return answer
        time.sleep(0.2)


def wait_final(run_dir: Path, timeout: float) -> dict[str, Any]:
    """Wait until status.json shows a final state (or the supervisor is gone); returns it."""
    deadline = time.monotonic() + timeout
    while True:
        status = read_status(Path(run_dir))
        if liveness(status) in ("final", "lost") or time.monotonic() >= deadline:
            return status
        time.sleep(0.2)


def kill_run(run_dir: Path, grace_s: float = 10.0) -> KillResult:
    """SIGTERM, then SIGKILL after grace_s, to the supervisor, torchrun and every worker.

    Workers live in their own process groups, so they are found one by one: recorded pids,
    processes naming the run directory, and all their descendants. Ends with state `killed`.
    """
    from tui.run.procs import kill_all, run_processes, terminate_all  # psutil only when killing

    try:
        run_dir = require_run_dir(Path(run_dir)).resolve()
    except NotARunError:
        # deleted or replaced under a live run: its processes still name it in their command
        # lines (which outlive the folder, unlike any record kept in it)
        orphans = run_processes(Path(run_dir).resolve())
        if not orphans:
            raise
        result = KillResult(state="gone (the run directory no longer holds this run)")
        # SIGKILL at once: a graceful stop would write a final checkpoint into whatever is at that path
        _merge(result, kill_all(orphans))
        result.survivors = [p.pid for p in run_processes(Path(run_dir).resolve())]
        return result
    paths = RunPaths(run_dir)
    status = read_status(run_dir)
    sup_pid = status.get("supervisor_pid") if isinstance(status.get("supervisor_pid"), int) else None
    recorded = [status.get("torchrun_pid"), *(status.get("worker_pids") or {}).values()]
    recorded += [a.get("torchrun_pid") for a in status.get("attempts") or [] if isinstance(a, dict)]
    procs = run_processes(run_dir, [p for p in recorded if isinstance(p, int)])
    if status.get("owner") == "script":  # made by mt.init under plain python/torchrun: no supervisor
        procs += [p for p in _own_rank0(status) if p.pid not in {q.pid for q in procs}]
        sup_pid = None
    was_final = status.get("state") in FINAL_STATES
    if was_final and not procs:
        raise ControlError(f"{run_dir}: the run has already ended ({status.get('state')}); nothing to kill")
    if not procs and sup_pid:
        raise ControlError(f"{run_dir}: no process of this run is running")
    result = KillResult()
    # only a pid whose command line names this run is signalled: a stale pid may be reused
    sup = [p for p in procs if p.pid == sup_pid]
    if sup:
        try:
            sup[0].send_signal(signal.SIGUSR1)  # tells it: no restart, record `killed`
        except Exception:  # noqa: BLE001 - the supervisor may be gone already; the others are signalled below
            pass
    others = [p for p in procs if p.pid != sup_pid]
    _merge(result, terminate_all(others, grace_s))
    # the supervisor writes `killed` and exits once torchrun is gone; give it a moment
    if sup:
        import psutil

        _, alive = psutil.wait_procs(sup, timeout=max(5.0, grace_s))
        _merge(result, terminate_all(alive, 2.0))
    # anything started meanwhile (a worker spawned during start-up) goes the same way
    for _ in range(3):
        rest = run_processes(run_dir)
        if not rest:
            break
        _merge(result, terminate_all(rest, grace_s))
    result.survivors = [p.pid for p in run_processes(run_dir)]
    status = read_status(run_dir)
    if was_final:
        result.state = str(status.get("state"))  # stragglers of an ended run: keep its outcome
    elif status.get("state") != "killed":
        status.update(state="killed", ended=time.time(), reason="killed by mt kill")
        write_json_atomic(paths.status, status)
    return result


def _own_rank0(status: dict[str, Any]) -> list[Any]:
    """Rank 0 of a run mt.init made, if its pid still runs the command line it recorded."""
    import psutil

    pid, cmdline = status.get("supervisor_pid"), status.get("owner_cmdline")
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(cmdline, list):
        return []
    try:
        proc = psutil.Process(pid)
        return [proc] if proc.cmdline() == cmdline else []
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _merge(result: KillResult, report: Any) -> None:
    result.terminated += [p for p in report.terminated if p not in result.terminated]
    result.killed += [p for p in report.killed if p not in result.killed]
