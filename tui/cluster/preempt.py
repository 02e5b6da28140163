"""How a Slurm job's run ends and goes on: the requeue after a preemption or the time-limit
warning, Slurm's own word on a job cancelled by someone else, the steps a cut-short stop lost,
and a pending job that left the queue without starting. docs/control.md "On Slurm".

The requeue is `scontrol requeue` from the job's supervisor once every rank's stop checkpoint is
on disk (submitit makes the same call from rank 0's USR1 handler, after pickling its callable).
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from mt.contract.incident import Incident
from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json
from mt.contract.records import Checkpoint, Record, RecordTail, Step
from mt.contract.status import FINAL_STATES, LIVE_STATES, Status, read_status, write_status
from tui.cluster.slurm import QUERY_TIMEOUT_S, SUBMIT_TIMEOUT_S, SlurmError, Submitted, _slurm, hostnames, queue_state, submit
from tui.read.wait import poll_until

NODE_FAIL_WINDOW_S = 10.0   # after Slurm's SIGTERM, how long the job's supervisor asks whether a node failed
NODE_FAIL_ASK_S = 0.3       # ... and how often (scontrol show job: a few ms for slurmctld)


@dataclass
class JobInfo:
    """What `scontrol show job` says of a job (no accounting needed: slurmctld keeps it MinJobAge)."""

    state: str
    reason: str = ""
    exit_code: str = ""
    restarts: int = 0
    nodes: str = ""   # NodeList: the nodes it holds now (a failed node leaves it while the job completes)

    def words(self) -> str:
        """`CANCELLED (exit 0:15)`, `NODE_FAIL (reason NodeDown)`: how a status reason quotes it."""
        extra = [f"reason {self.reason}"] if self.reason not in ("", "None") else []
        extra += [f"exit {self.exit_code}"] if self.exit_code not in ("", "0:0") else []
        return f"{self.state} ({', '.join(extra)})" if extra else self.state


def job_info(job_id: str, timeout_s: float = SUBMIT_TIMEOUT_S) -> JobInfo | None:
    """Slurm's record of the job; None when Slurm no longer knows it (or cannot be asked)."""
    try:
        done = _slurm("scontrol", "show", "job", "-o", job_id, timeout_s=timeout_s)
    except SlurmError:
        return None
    fields = dict(tok.partition("=")[::2] for tok in done.stdout.split() if "=" in tok)
    if done.returncode != 0 or not fields.get("JobState"):
        return None
    restarts = fields.get("Restarts", "0")
    nodes = fields.get("NodeList", "")
    return JobInfo(fields["JobState"], fields.get("Reason", ""), fields.get("ExitCode", ""),
                   int(restarts) if restarts.isdigit() else 0, "" if nodes == "(null)" else nodes)


def restart_count(env: Mapping[str, str]) -> int:
    """SLURM_RESTART_COUNT: how many times Slurm has requeued the job (0 on its first run)."""
    got = env.get("SLURM_RESTART_COUNT", "")
    return int(got) if got.isdigit() else 0


def requeue(job_id: str) -> str | None:
    """`scontrol requeue`: the job goes back to the queue and runs again (SLURM_RESTART_COUNT + 1);
    None when done, else Slurm's one line on why not."""
    try:
        done = _slurm("scontrol", "requeue", job_id)
    except SlurmError as e:
        return str(e)
    info = job_info(job_id) if done.returncode != 0 else None
    if done.returncode == 0 or (info is not None and _queued_again(info)):   # requeued by someone else meanwhile
        return None
    why = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return f"scontrol requeue {job_id} failed: {why[-1] if why else f'exit {done.returncode}'}"


def cancel_job(run_dir: Path, job_id: str, grace_s: float) -> bool:
    """`mt kill` of a Slurm run, from anywhere: USR1 to the job's tasks (the supervisor records
    `killed`, the rest die of it), then `scancel` (never requeued; Slurm kills what is left on
    every node). False when the job is not in the queue (or squeue cannot say)."""
    queued = queue_state(job_id)
    if not queued:
        return False
    try:
        if queued.startswith("RUNNING"):
            _slurm("scancel", "--signal=USR1", job_id)   # steps only: the batch shell keeps its USR1 trap out of it
            # until the supervisor has heard it (it then records `killed` whatever comes): waiting for
            # `killed` itself would let the job end on its own first, and Slurm record COMPLETED
            poll_until(lambda: _kill_heard(read_status(run_dir)), grace_s, 0.1)
        _slurm("scancel", job_id)
    except SlurmError:
        return False
    poll_until(lambda: not queue_state(job_id), max(30.0, grace_s), 0.2)
    return True


def _kill_heard(status: Status) -> bool:
    return status.state == "killed" or (status.state == "stopping" and status.reason == "kill requested")


def _queued_again(info: JobInfo) -> bool:
    """Back in the queue already: Slurm requeued it itself (PreemptMode=REQUEUE, someone's requeue)."""
    return info.state.startswith("REQUEUE") or info.state == "PENDING"


@dataclass
class CheckpointLag:
    """The newest step and the newest checkpoint's step in events.jsonl, as the supervisor reads it."""

    step: int | None = None
    checkpoint: int | None = None
    checkpoint_at: float | None = None

    def feed(self, records: Iterable[Record]) -> Iterator[Record]:
        """Pass records through, noting steps and checkpoints on the way."""
        for ev in records:
            if isinstance(ev, Step):
                self.step = ev.step
            elif isinstance(ev, Checkpoint):
                self.checkpoint, self.checkpoint_at = ev.step, ev.t
            yield ev

    @property
    def lost(self) -> int:
        """Steps done since the newest checkpoint: what a resume from it does again."""
        return max(0, (self.step or 0) - (self.checkpoint or 0))


@dataclass
class Ending:
    """What the job's supervisor records for a stopped run under Slurm."""

    state: str
    reason: str
    requeue: bool = False
    slurm_state: str | None = None


def after_stop(job_id: str, stop_signal: int | None, progress: CheckpointLag, reason: str,
               env: Mapping[str, str] = os.environ) -> Ending:
    """A stop that ended with its checkpoint: requeue when Slurm asked for it (SIGTERM, from a
    preemption or the time-limit warning) and the job still runs; a job being cancelled is not; a
    job requeued by anyone (its restart count past this run's) is pending, not requeued twice."""
    if stop_signal != signal.SIGTERM:   # `mt stop` (a control request, or SIGINT for a bare script)
        return Ending("stopped", reason)
    info = job_info(job_id)
    at = f"the checkpoint at step {progress.checkpoint}" if progress.checkpoint is not None else "no checkpoint"
    again = requeued(job_id, env, f"stopped with {at}", info)
    if again is not None:
        return again
    if info is not None and (info.state == "RUNNING" or _queued_again(info)):
        # RUNNING: a preemption's or the time-limit warning's SIGTERM to the tasks, the job goes on: we
        # requeue it. Queued again: PreemptMode=REQUEUE or someone's `scontrol requeue` did it already.
        return Ending("pending", f"preempted (SIGTERM from Slurm, job {job_id}): requeued after {at}; the next "
                      "attempt starts when Slurm runs the job again", requeue=not _queued_again(info),
                      slurm_state="REQUEUED")
    if info is None:
        return Ending("stopped", f"{reason}; Slurm could not be asked about job {job_id}: not requeued")
    # a job being cancelled reads COMPLETING until its tasks are gone: its final CANCELLED comes after us
    ended = "CANCELLED" if info.state == "COMPLETING" else info.state
    return Ending("stopped", f"{ended} in Slurm (job {job_id}, {info.words()} as its tasks ended): stopped with "
                  f"{at}; not requeued", slurm_state=ended)


def down_nodes(nodes: list[str]) -> list[str]:
    """Those of `nodes` Slurm holds down or failed now (`scontrol show node`: DOWN, FAIL, NOT_RESPONDING)."""
    if not nodes:
        return []
    try:
        done = _slurm("scontrol", "show", "node", "-o", ",".join(nodes), timeout_s=QUERY_TIMEOUT_S)
    except SlurmError:
        return []
    out = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        fields = dict(tok.partition("=")[::2] for tok in line.split() if "=" in tok)
        flags = set(fields.get("State", "").replace("+", " ").replace("*", " NOT_RESPONDING").split())
        if fields.get("NodeName") in nodes and flags & {"DOWN", "FAIL", "FAILING", "NOT_RESPONDING"}:
            out.append(fields["NodeName"])
    return out


def requeued(job_id: str, env: Mapping[str, str], what: str, info: JobInfo | None = None) -> Ending | None:
    """Requeued by anyone (`scontrol requeue` by hand, PreemptMode=REQUEUE): Slurm counted the restart
    at once (the job reads COMPLETING while its tasks end, then PENDING). `pending`, whatever this
    attempt ended as (`what`); never requeued twice. None when its restart count is still this run's."""
    info = info or job_info(job_id)
    if info is None or info.restarts <= restart_count(env):
        return None
    return Ending("pending", f"requeued in Slurm (job {job_id}, {info.words()}, restart {info.restarts}): {what}; "
                  "the next attempt starts when Slurm runs the job again", slurm_state="REQUEUED")


def requeued_by_slurm(job_id: str, env: Mapping[str, str], what: str, info: JobInfo | None = None) -> Ending | None:
    """The job's attempt ended because a node failed and Slurm requeued the job itself (NODE_FAIL with
    --requeue and JobRequeue: its restart count went past this run's, and the node left its NodeList while
    it completes, or once the job is queued again Slurm holds the node down): `pending`, naming the node,
    whatever this node's part ended as (Slurm's SIGTERM, or its ranks lost their peer). None otherwise."""
    info = info or job_info(job_id)
    if info is None or info.restarts <= restart_count(env):
        return None
    ours = hostnames(env.get("SLURM_JOB_NODELIST", ""))
    held = set(hostnames(info.nodes))
    # a requeued job that has finished completing holds no node: which of ours is down says it
    lost = [n for n in ours if n not in held] if held else down_nodes(ours)
    if not lost:   # requeued with every node (PreemptMode=REQUEUE, someone's requeue): after_stop's to say
        return None
    return Ending("pending", f"node {', '.join(lost)} failed (NODE_FAIL): Slurm requeued job {job_id} (restart "
                  f"{info.restarts}); {what}; the next attempt starts when Slurm runs the job again", slurm_state="NODE_FAIL")


def cut_short(status: Status, progress: CheckpointLag, job_id: str) -> Incident | None:
    """At the start of a job's attempt: the previous one ended under Slurm without its supervisor
    recording the end (killed at the end of the grace period, or with its node); what it lost."""
    if status.state not in LIVE_STATES or not status.attempts:
        return None
    was = "stopping: its stop's checkpoint had not landed" if status.state == "stopping" else status.state
    at = f"step {progress.checkpoint}" if progress.checkpoint is not None else "the start (no checkpoint)"
    said = status.slurm_state in ("NODE_FAIL", "REQUEUED") and status.reason
    why = status.reason if said else "the grace period was too short, or its node failed"
    detail = (f"attempt {status.attempt} of Slurm job {job_id} ended before its supervisor could record it "
              f"(it was {was}; {why}): "
              f"{progress.lost} steps lost since the newest checkpoint, at {at}")
    return Incident("stop_cut_short", "error", progress.step, f"{progress.lost} steps lost: Slurm ended attempt "
                    f"{status.attempt} before its checkpoint", detail,
                    "raise [slurm] signal_grace_s (or the partition's GraceTime) above the time a checkpoint takes; "
                    "checkpoint more often ([checkpoint] every_steps)",
                    {"attempt": status.attempt, "state": status.state, "last_step": progress.step,
                     "checkpoint_step": progress.checkpoint, "lost_steps": progress.lost, "slurm_job_id": job_id})


@dataclass
class Queued:
    """A Slurm run whose job is still in the queue: `waiting` (PENDING: no supervisor of it runs now,
    whatever its status last said) or running; `line` says so."""

    line: str
    waiting: bool


def in_queue(run_dir: Path) -> Queued | None:
    """Why `mt resume` must not submit a Slurm run again: its job is still queued (already: its next
    attempt starts with the job) or running."""
    status = read_status(run_dir)
    job = status.slurm_job_id
    queued = queue_state(job) if job else None
    if not queued:
        return None
    if queued.startswith("PENDING"):
        return Queued(f"{run_dir}: already queued: Slurm job {job} is {queued}; its next attempt starts when Slurm "
                      "runs it (`mt stop` cancels it)", True)
    return Queued(f"{run_dir}: its Slurm job {job} is still in the queue ({queued}); `mt stop` or `mt kill` it first", False)


def stop_pending(run_dir: Path, timeout_s: float) -> Status | None:
    """`mt stop` of a Slurm run whose job waits in the queue (submitted, or requeued by anyone, while its
    status may still say `stopping`: Slurm killed its supervisor first): `scancel` the job and record
    `stopped` (a resume submits it again; its checkpoints stay). None when the job is not pending (it
    runs: its supervisor takes the stop)."""
    status = read_status(run_dir)
    job = status.slurm_job_id
    if not job or status.is_final or status.state not in ("pending", *LIVE_STATES):
        return None
    queued = queue_state(job)
    if queued is None:
        raise SlurmError(f"{run_dir}: squeue cannot say whether Slurm job {job} still waits; `scancel {job}` by hand")
    if not (queued.startswith("PENDING") or (queued == "" and status.state == "pending")):
        return None
    if queued:
        done = _slurm("scancel", job)
        if done.returncode != 0:
            raise SlurmError(f"scancel {job} failed: {(done.stderr.strip() or done.stdout.strip() or 'no message')}")
    poll_until(lambda: not queue_state(job), timeout_s, 0.2)
    if read_status(run_dir).state != status.state:   # it started meanwhile: its supervisor recorded the stop
        return read_status(run_dir)
    status.slurm_state = "CANCELLED"
    status.end("stopped", f"stopped while pending in Slurm: job {job} cancelled before its next attempt (mt stop)",
               time.time(), status.exit_code)
    write_status(RunPaths(Path(run_dir)), status)
    return status


def resubmit(run_dir: Path) -> Submitted:
    """`mt resume` of a Slurm run: the batch script again, sbatch; its next attempt starts with the job.
    A failed submission leaves the run `failed` with Slurm's line (never `starting` for good)."""
    try:
        return submit(load_config_json(RunPaths(Path(run_dir)).config), Path(run_dir))
    except SlurmError as e:
        status = read_status(run_dir)
        status.end("failed", f"mt resume: {e}", time.time(), status.exit_code)
        write_status(RunPaths(Path(run_dir)), status)
        raise


def gone_status(run_dir: Path) -> Status | None:
    """A Slurm run whose job left the queue while its status still says it waits or runs is over, and
    no supervisor will ever write it (the allocation is gone): its status as Slurm's word settles it,
    not written (views show it; `record_gone`, for the commands that act on a run, writes it).
    Pending: `killed` (it never started). Live: the job's supervisor was killed with it (the grace
    period ended before the stop's checkpoint, a node failed): `failed`, and how many steps since
    the newest checkpoint were lost."""
    status = read_status(run_dir)
    waiting = status.state in ("pending", *LIVE_STATES)
    if not waiting or status.slurm_job_id is None or queue_state(status.slurm_job_id) != "":
        return None
    if read_status(run_dir).state != status.state:   # its supervisor wrote meanwhile
        return None
    info = job_info(status.slurm_job_id)
    if info is not None and info.state in ("PENDING", "REQUEUED", "RUNNING", "CONFIGURING"):
        return None
    said = info.words() if info is not None else "no longer known to Slurm"
    status.slurm_state = info.state if info is not None else None
    if status.state == "pending":
        status.end("killed", f"Slurm job {status.slurm_job_id} left the queue without starting: {said}", time.time(), status.exit_code)
        return status
    progress = CheckpointLag()
    for _ in progress.feed(RecordTail(RunPaths(Path(run_dir)).events).iter_new()):
        pass
    at = f"step {progress.checkpoint}" if progress.checkpoint is not None else "the start (no checkpoint)"
    status.end("failed", f"Slurm job {status.slurm_job_id} ended ({said}) while the run was {status.state}, before its "
               f"supervisor could record it: {progress.lost} steps lost since the newest checkpoint, at {at}",
               time.time(), status.exit_code)
    return status


def record_gone(run_dir: Path) -> Status | None:
    """`gone_status`, written: what `mt resume`, `mt stop` and `mt kill` do first (views only read)."""
    status = gone_status(run_dir)
    if status is not None and read_status(run_dir).state not in (None, status.state, *FINAL_STATES):
        write_status(RunPaths(Path(run_dir)), status)
    return status


class JobEnd:
    """The job's supervisor's part in how a Slurm attempt ends: the first stop signal, what a cut-short
    stop lost, the requeue after a preemption's checkpoint (`job_id` None: not the job's, or no Slurm)."""

    def __init__(self, under_slurm: bool, job_id: str | None) -> None:
        self.under_slurm, self.job_id = under_slurm, job_id
        self.signal: int | None = None   # the first stop signal: SIGTERM under Slurm is a preemption
        self.progress = CheckpointLag()       # newest step and checkpoint
        self.signal_at: float | None = None      # when node_failure first saw Slurm's SIGTERM (monotonic)
        self.next_ask = 0.0
        self.node_fail: Ending | None = None     # Slurm said a node of the job failed, or it requeued the job

    def stop_signal(self, signum: int) -> bool:
        """Note a stop signal; whether to forward it to torchrun: not Slurm's SIGTERM (preemption, cancel,
        the time-limit trap), which Slurm sent every task's processes itself (each rank would get it twice)."""
        self.signal = self.signal or signum
        return not (self.under_slurm and signum == signal.SIGTERM)

    def ending(self, state: str, reason: str) -> Ending | None:
        """How the job's attempt really ended (requeued by Slurm after a node failed; a stop: preempted
        and to be requeued, cancelled), or None."""
        if not self.job_id:
            return None
        what = f"this attempt ended {state}: {reason}"
        by_slurm = (requeued_by_slurm(self.job_id, os.environ, what) or
                    (requeued(self.job_id, os.environ, what) if state == "failed" else None)) \
            if state in ("stopped", "failed") else None
        return by_slurm or (after_stop(self.job_id, self.signal, self.progress, reason) if state == "stopped" else None)

    def node_failure(self) -> Ending | None:
        """Slurm's SIGTERM because a node of the job failed, or someone requeued the job (Slurm requeued
        it, NODE_FAIL or REQUEUED): asked again every
        NODE_FAIL_ASK_S for NODE_FAIL_WINDOW_S after the signal (a loaded slurmctld may record the
        requeue after its SIGTERM came), for the job's supervisor may be killed with its tasks KillWait
        after it. The Ending once Slurm said it (the same one after), else None."""
        if not self.job_id or self.signal != signal.SIGTERM:
            return None
        now = time.monotonic()
        self.signal_at = self.signal_at or now
        if self.node_fail is None and now >= self.next_ask and now - self.signal_at <= NODE_FAIL_WINDOW_S:
            self.next_ask = now + NODE_FAIL_ASK_S
            info, what = job_info(self.job_id, QUERY_TIMEOUT_S), "this node's part is stopping"
            if info is not None:
                self.node_fail = requeued_by_slurm(self.job_id, os.environ, what, info) or requeued(self.job_id, os.environ, what, info)
        return self.node_fail

    def lost_before(self, status: Status) -> Incident | None:
        """The previous attempt's stop that Slurm cut short before its checkpoint (the steps lost)."""
        return cut_short(status, self.progress, self.job_id) if self.job_id else None

    def attempt_keys(self) -> dict[str, int]:
        return {"slurm_restart": restart_count(os.environ)} if self.job_id else {}

    def requeue(self, end: Ending | None) -> str | None:
        """Requeue a preempted job once its final state is written; what went wrong, or None."""
        return requeue(self.job_id) if end is not None and end.requeue and self.job_id else None
