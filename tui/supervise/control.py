"""Talk to a live run: drop control requests, wait for the engine's answer, kill the run.

Used by `mt ckpt` / `mt stop` / `mt kill` and by the dashboard's c / s / k keys.
"""
from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mt.contract.config import ConfigError
from mt.contract.events import CONTROL_ACTIONS
from mt.contract.jsonl import write_json_atomic
from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json
from mt.contract.records import RecordTail
from mt.contract.status import Status, read_status, write_status
from tui.read.rundir import NotARunError, liveness, require_run_dir
from tui.read.wait import poll_until
from tui.stacks.ranks import own_rank0
from tui.state.answers import ControlAnswer, note_answer

if TYPE_CHECKING:
    from tui.supervise.procs import SignalReport


class ControlError(RuntimeError):
    """The request cannot be made (not a run, run not live, unknown action)."""


class NotReporting(ControlError):
    """Nobody reads control/: the run's script has not called run.step in this attempt."""


def _require_live(run_dir: Path) -> Status:
    run_dir = require_run_dir(run_dir)
    status = read_status(run_dir)
    live = liveness(status)
    if live == "final":
        raise ControlError(f"{run_dir}: the run has already ended ({status.state})")
    if live == "lost":
        raise ControlError(f"{run_dir}: the run is not running (its supervisor is gone)")
    if live == "pending":  # queued in Slurm: nothing reads control/ until its supervisor starts
        raise ControlError(f"{run_dir}: the run has not started yet (pending in Slurm, job {status.slurm_job_id})")
    return status


def takes_requests(run_dir: Path, status: Status) -> bool:
    """Whether the run reads control/: mt's engine does, a script once it calls run.step (rank
    0's heartbeat thread polls it from then on); a heartbeat of this attempt says it did."""
    from tui.read.nodes import called_mt_init

    paths = RunPaths(Path(run_dir))
    try:
        script = load_config_json(paths.config).launch.script
    except ConfigError:
        script = ""   # unreadable: taken as the engine's, which reads control/
    if not script or status.by_script:
        return True  # the engine, or a run mt.init made (its rank 0 is the script, which uses mt)
    return called_mt_init(paths, status.attempt)   # a job's: under nodes/


def not_reporting_line(run_dir: Path, action: str) -> str:
    """Why a bare script cannot take `action` through control/, and what would let it."""
    return (f"{run_dir}: {action} now needs run.step: the script reports nothing through mt in this attempt "
            "(`run = mt.init()`, then `run.step(step, ...)` in its loop; docs/library.md)")


def takes_knobs(run_dir: Path, status: Status) -> bool:
    """Whether the run reads knobs: mt's engine takes every one (its run_start's `knobs`); a script reads none."""
    try:
        script = load_config_json(RunPaths(Path(run_dir)).config).launch.script
    except ConfigError:
        script = ""   # unreadable: taken as the engine's, which answers a set itself
    return not script and not status.by_script


def send_request(run_dir: Path, action: str, settings: dict[str, float | int] | None = None) -> str:
    """Write `control/<id>.json` atomically for the engine to pick up; returns the request id.

    `settings`: a `set` request's knobs, already checked (mt/contract/knobs.py). NotReporting when
    nobody would read it (a script that has not called run.step); ControlError for a set to a script."""
    if action not in CONTROL_ACTIONS:
        raise ControlError(f"unknown action {action!r} (known: {', '.join(CONTROL_ACTIONS)})")
    run_dir = Path(run_dir)
    status = _require_live(run_dir)
    if action == "set" and not takes_knobs(run_dir, status):
        raise ControlError(f"{run_dir}: the run's script reads no knobs: mt set turns the knobs of mt's own engine "
                           "(a script changes its own settings; docs/library.md)")
    if not takes_requests(run_dir, status):
        raise NotReporting(not_reporting_line(run_dir, action))
    request_id = f"{action[:4]}-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:8]}"
    paths = RunPaths(run_dir)
    paths.control.mkdir(mode=0o700, exist_ok=True)
    request: dict[str, Any] = {"id": request_id, "action": action, "t": time.time()}
    if settings:
        request["settings"] = dict(settings)
    write_json_atomic(paths.control / f"{request_id}.json", request)
    return request_id


def request_stop(run_dir: Path) -> str | None:
    """A graceful stop: a `stop` request (its id), or, for a script that reports nothing through
    mt, SIGINT to its supervisor (None), which forwards a SIGTERM and records `stopped`."""
    try:
        return send_request(run_dir, "stop")
    except NotReporting:
        from tui.read.procs import run_process

        pid = read_status(Path(run_dir)).supervisor_pid
        sup = run_process(pid, Path(run_dir)) if pid is not None else None
        if sup is None:
            raise ControlError(f"{run_dir}: the run is not running (its supervisor is gone)") from None
        # SIGINT, not SIGTERM: under Slurm a supervisor's SIGTERM is Slurm's preemption, and requeues the job
        sup.send_signal(signal.SIGINT)
        return None


def wait_answer(run_dir: Path, request_id: str, timeout: float) -> ControlAnswer:
    """Follow events.jsonl until the engine answers request_id (done/rejected) or timeout.

    A checkpoint request counts as answered once both its `done` control event and its
    `checkpoint` event are there. Status `timeout` when no answer came in time, `ended` when
    the run ended first.
    """
    paths = RunPaths(Path(run_dir))
    tail = RecordTail(paths.events)
    answers = {request_id: ControlAnswer(request_id)}
    deadline = time.monotonic() + timeout
    while True:
        for ev in tail.iter_new():
            note_answer(answers, ev, only=request_id)
        answer = answers[request_id]
        if answer.complete:
            return answer
        if time.monotonic() >= deadline:
            return _unanswered(answer, "timeout")
        status = read_status(paths.root)
        if liveness(status) in ("final", "lost"):
            for ev in tail.iter_new():  # the answer may have landed just before the end
                note_answer(answers, ev, only=request_id)
            return _unanswered(answer, "ended", f"the run ended ({status.state}) before answering")
        time.sleep(0.2)


def _unanswered(answer: ControlAnswer, status: str, detail: str | None = None) -> ControlAnswer:
    """A done answer still waiting for its checkpoint stays done; anything else says `status`."""
    if not answer.answered:
        answer.status, answer.detail = status, answer.detail if detail is None else detail
    return answer


def wait_final(run_dir: Path, timeout: float) -> Status:
    """Wait until status.json shows a final state (or the supervisor is gone); returns it."""
    return poll_until(lambda: read_status(Path(run_dir)), timeout, 0.2,
                      done=lambda status: liveness(status) in ("final", "lost"))


def kill_run(run_dir: Path, grace_s: float = 10.0) -> SignalReport:
    """SIGUSR1 (a kill, never a stop: no rank saves), then SIGKILL after grace_s, to torchrun and
    every worker; the supervisor's SIGUSR1 makes it record `killed` and never restart.

    Workers live in their own process groups, so they are found one by one: recorded pids,
    processes naming the run directory, and all their descendants. Ends with state `killed`.
    """
    from tui.cluster.preempt import cancel_job
    from tui.read.procs import run_processes  # psutil only when killing
    from tui.supervise.procs import KILL_SIGNAL, SignalReport, kill_all, terminate_all

    try:
        run_dir = require_run_dir(Path(run_dir)).resolve()
    except NotARunError:
        # deleted or replaced under a live run: its processes still name it in their command
        # lines (which outlive the folder, unlike any record kept in it)
        orphans = run_processes(Path(run_dir).resolve())
        if not orphans:
            raise
        result = SignalReport(state="gone (the run directory no longer holds this run)")
        # SIGKILL at once: a graceful stop would write a final checkpoint into whatever is at that path
        result.merge(kill_all(orphans))
        result.survivors = [p.pid for p in run_processes(Path(run_dir).resolve())]
        return result
    paths = RunPaths(run_dir)
    status = read_status(run_dir)
    sup_pid = status.supervisor_pid
    # a Slurm job's processes may be on other nodes: Slurm ends them there, and the job is not requeued
    cancelled = bool(status.slurm_job_id) and not status.is_final and cancel_job(run_dir, status.slurm_job_id, grace_s)
    procs = run_processes(run_dir, status.recorded_pids())
    if status.by_script:  # made by mt.init under plain python/torchrun: no supervisor
        procs += [p for p in own_rank0(status) if p.pid not in {q.pid for q in procs}]
        sup_pid = None
    was_final = status.is_final
    if was_final and not procs:
        raise ControlError(f"{run_dir}: the run has already ended ({status.state}); nothing to kill")
    if not procs and sup_pid and not cancelled:
        raise ControlError(f"{run_dir}: no process of this run is running")
    result = SignalReport(state=f"killed (Slurm job {status.slurm_job_id} cancelled)" if cancelled else "killed",
                          cancelled=status.slurm_job_id if cancelled else None)
    # only a pid whose command line names this run is signalled: a stale pid may be reused
    sup = [p for p in procs if p.pid == sup_pid]
    if sup:
        try:
            sup[0].send_signal(KILL_SIGNAL)  # tells it: no restart, record `killed`
            result.terminated.append(sup[0].pid)
        except Exception:  # noqa: BLE001 - the supervisor may be gone already; the others are signalled below
            pass
        _wait_kill_noted(run_dir, sup[0], KILL_NOTED_S)
    others = [p for p in procs if p.pid != sup_pid]
    # SIGUSR1, not SIGTERM: a rank reads SIGTERM as a stop and saves a checkpoint (a diverged run's
    # state the user meant to discard, and keep_last may delete a good one for it); USR1 ends it as is
    result.merge(terminate_all(others, grace_s, KILL_SIGNAL))
    # the supervisor writes `killed` and exits once torchrun is gone; give it a moment
    if sup:
        import psutil

        _, alive = psutil.wait_procs(sup, timeout=max(5.0, grace_s))
        result.merge(terminate_all(alive, 2.0))
    # anything started meanwhile (a worker spawned during start-up) goes the same way
    for _ in range(3):
        rest = run_processes(run_dir)
        if not rest:
            break
        result.merge(terminate_all(rest, grace_s, KILL_SIGNAL))
    result.survivors = [p.pid for p in run_processes(run_dir)]
    status = read_status(run_dir)
    if was_final:
        result.state = str(status.state)  # stragglers of an ended run: keep its outcome
    elif status.state != "killed":
        status.end("killed", "killed by mt kill", time.time(), status.exit_code)
        write_status(paths, status)
    return result


KILL_NOTED_S = 5.0   # how long `mt kill` waits for the supervisor to record the kill before ending the ranks


def _wait_kill_noted(run_dir: Path, sup: Any, timeout: float) -> None:
    """Until the supervisor has said `kill requested` (or ended): ranks that die before it did
    would read as a crash to the incident rules, which judge dead ranks of a `running` run."""
    def noted() -> bool:
        status = read_status(run_dir)
        return not sup.is_running() or status.is_final or status.reason == "kill requested"
    poll_until(noted, timeout, 0.05)


def kill_summary(result: SignalReport) -> str:
    """`mt kill`'s line: what it ended here, and what Slurm ended, in words that hold when nothing was left."""
    n = len(set(result.terminated) | set(result.killed))
    if n:
        forced = f", {len(result.killed)} needed SIGKILL" if result.killed else ""
        did = f"{n} process(es) terminated{forced}"
    elif result.cancelled:
        did = f"no process left to terminate here (Slurm ended the processes of job {result.cancelled})"
    else:
        did = "no process left to terminate (they had exited)"
    return f"killed: {did}; state {result.state}"


