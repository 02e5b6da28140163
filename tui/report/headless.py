"""`--headless`: follow a run and print compact progress lines until it ends.

At most one step line per `min_interval_s` (`--every`, so SLURM / nohup logs stay small; 0 = one
per logged step), plus one line per checkpoint, eval, control answer and attempt, and one when an
incident opens and one when it closes (engine and supervisor incidents alike).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, TextIO

from mt.contract.incident import IncidentLine
from mt.contract.paths import RunPaths
from mt.contract.records import Checkpoint, ControlEvent, Eval, Metrics, Record, RollbackEvent, RunEnd, RunStart, Sample, Step
from mt.contract.status import CLEAN_STATES, FINAL_STATES, Status, read_status
from tui.format.fmt import (
    NA,
    anatomy_lines,
    at_step,
    fmt_epoch,
    fmt_eta,
    fmt_num,
    fmt_rate,
    fmt_rollback,
    fmt_sample,
    fmt_step,
    fmt_values,
    fmt_write_time,
    safe_text,
    stacks_lines,
)
from tui.read.follower import PollResult, RunFollower
from tui.read.nodes import JobReader
from tui.read.rundir import liveness
from tui.report.nodes import node_lines
from tui.state.runstate import RunState, apply_status, cause_of


def step_line(st: RunState) -> str:
    width = len(str(st.max_steps)) if st.max_steps is not None else len(NA)
    return (f"step {fmt_step(st.step, st.max_steps):>{2 * width + 1}}{fmt_epoch(st.epoch, '  epoch ')}  loss {fmt_num(st.loss, '.4f')}  lr {fmt_num(st.lr, '.2e')}"
            f"  {fmt_rate(st.tokens_per_s, st.samples_per_s)}  ETA {fmt_eta(st.eta_s(), st.quiet_s(time.time()))}")


def event_line(ev: Record) -> str | None:
    """One line for a notable record, or None for those not worth a line."""
    if isinstance(ev, RunStart):
        frm = f", resuming from step {ev.start_step}" if ev.start_step else ""
        if ev.params_total is None:
            return f"attempt {ev.attempt} started{frm}"
        frozen = ev.params_trainable is not None and ev.params_trainable < ev.params_total
        trains = f" ({ev.params_trainable:,} trainable)" if frozen else ""
        return f"attempt {ev.attempt} started: world {ev.world_size} x {ev.device}, {ev.params_total:,} params{trains}{frm}"
    if isinstance(ev, Eval):
        return f"eval  step {ev.step}  val_loss {fmt_num(ev.val_loss, '.4f')}" + (f"  {fmt_values(ev.metrics)}" if ev.metrics else "")
    if isinstance(ev, Sample):
        return f"sample  step {ev.step}  [{ev.index}] {fmt_sample(ev.prompt, ev.text, 160)}"
    if isinstance(ev, Metrics):
        return f"metrics  step {ev.step}  " + "  ".join(f"{k} {fmt_num(v, '.4g')}" for k, v in list(ev.values.items())[:8])
    if isinstance(ev, Checkpoint):
        took = f" in {fmt_write_time(ev.seconds, ev.blocking_s)}" if ev.seconds is not None else ""
        return f"checkpoint saved at step {ev.step} ({ev.reason}{took}): {ev.path}"
    if isinstance(ev, IncidentLine):
        return f"incident [{ev.severity}] {ev.code} {at_step(ev.step)}: {ev.title}"
    if isinstance(ev, ControlEvent) and ev.status in ("done", "rejected"):
        return f"control {ev.action} {ev.status}: {ev.detail}".rstrip(": ")
    if isinstance(ev, RunEnd):
        return f"run ended {at_step(ev.step)}: {ev.status} ({ev.reason})"
    if isinstance(ev, RollbackEvent):
        return fmt_rollback(ev.step, ev.to_step, ev.skip_batches, ev.lr_scale, ev.why, ev.by, ev.count)
    return None


def exit_code_for(state: str) -> int:
    """0 for completed/stopped, 1 for anything else (failed, killed, lost)."""
    return 0 if state in CLEAN_STATES else 1


def incident_open_line(inc: IncidentLine) -> str:
    return f"incident [{inc.severity}] {inc.code} {at_step(inc.step)}: {inc.title}"


def incident_close_line(inc: IncidentLine) -> str:
    return f"incident closed: {inc.code} {at_step(inc.step)}: {inc.title}"


def incident_keys(st: RunState) -> list[tuple[tuple[str, int | None, int], IncidentLine]]:
    """Each incident with a key that survives a rebuilt state: (code, step, n-th of that pair)."""
    seen: dict[tuple[str, int | None], int] = {}
    out = []
    for inc in st.incidents:
        n = seen.get((inc.code, inc.step), 0)
        seen[(inc.code, inc.step)] = n + 1
        out.append(((inc.code, inc.step, n), inc))
    return out


class _LineFollower(RunFollower):
    """A RunFollower that also keeps, in order, each record it folds (a step as its line)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir, keep_series=False)
        self.folded: list[tuple[str, Record]] = []

    def _fold(self, ev: Record, res: PollResult) -> None:
        super()._fold(ev, res)
        self.folded.append((step_line(self.state) if isinstance(ev, Step) else "", ev))


NODES_EVERY_S = 30.0   # --headless prints a job's nodes this often (a batch log, not a screen)
SETTLE_S = 10.0   # how long a failed run_end waits for the supervisor's verdict on who failed first


class _Printer:
    """What --headless has printed so far, and the lines each poll adds."""

    def __init__(self, out: TextIO, min_interval_s: float) -> None:
        self.out, self.min_interval_s = out, min_interval_s
        self.last_print = -float("inf")
        self.printed_step: int | None = None
        self.state_shown: str | None = None
        self.opened: set[tuple[str, int | None, int]] = set()
        self.closed: set[tuple[str, int | None, int]] = set()
        self.verdicts: set[tuple[str, int | None, int]] = set()   # incidents whose stacks were printed
        self.caused: set[tuple[str, int | None, int]] = set()     # incidents whose replay cause was printed
        self.silent: set[tuple[str, int | None, int]] = set()   # before a resume: read, never printed
        self.pending_end: tuple[RunEnd, float] | None = None   # a failed run_end waiting for its exit incident
        self.job_shown: tuple[str | None, int | None] | None = None   # a Slurm run: (pending or running, attempt) said last

    def write(self, line: str) -> None:
        self.out.write(safe_text(line) + "\n")   # every line holds the run's own names and reasons

    def step(self, st: RunState, now: float) -> None:
        if st.step is not None and st.step != self.printed_step:
            self.write(step_line(st))
            self.last_print, self.printed_step = now, st.step

    def incidents(self, st: RunState) -> None:
        for key, inc in incident_keys(st):
            if key in self.silent:
                continue
            if key not in self.opened:
                self.opened.add(key)
                self.write(incident_open_line(inc))
                for line in anatomy_lines(inc.evidence):  # a straggler's verdict and each rank's step
                    self.write(f"  {line}")
            if "verdict" in inc.evidence and key not in self.verdicts:
                self.verdicts.add(key)
                for line in stacks_lines(inc.evidence):
                    self.write(f"  {line}")
            cause = cause_of(st.causes, inc)
            if cause and key not in self.caused:  # mt replay's report, once it is there
                self.caused.add(key)
                self.write(f"  cause (mt replay): {cause}")
            if inc.status == "closed" and key not in self.closed:
                self.closed.add(key)
                self.write(incident_close_line(inc))

    def end(self, ev: RunEnd, st: RunState) -> None:
        reason = (st.first_failure() or ev.reason) if ev.status == "failed" else ev.reason
        self.write(f"run ended {at_step(ev.step)}: {ev.status} ({reason})")

    def job(self, status: Status) -> None:
        """A Slurm run: one line when it is queued (Slurm's reason, and why it waits) and one when its
        supervisor starts an attempt."""
        phase = "pending" if status.state == "pending" else "running" if status.state in ("starting", "running") else None
        if status.slurm_job_id is None or phase is None or (phase, status.attempt) == self.job_shown:
            return
        self.job_shown = (phase, status.attempt)
        if phase == "pending":
            from tui.report.runs import pending_line

            self.write(f"state: {pending_line(status.slurm_job_id)}" + (f" ({status.reason})" if status.reason else ""))
        else:
            self.write(f"state: running: Slurm job {status.slurm_job_id}, attempt {status.attempt or 1}")
        self.out.flush()

    def fold(self, folded: list[tuple[str, Record]], st: RunState, now: float, final: bool) -> None:
        """The lines for what one poll read, in file order."""
        for line, ev in folded:
            if isinstance(ev, Step):
                if self.min_interval_s <= 0 and ev.step != self.printed_step:
                    self.write(line)
                    self.last_print, self.printed_step = now, ev.step
                continue
            if self.pending_end is not None and isinstance(ev, RunStart):
                self.end(self.pending_end[0], st)
                self.pending_end = None
            if isinstance(ev, IncidentLine):
                self.incidents(st)
            elif isinstance(ev, RunEnd):
                self.step(st, now)
                if ev.status == "failed" and not final:
                    self.pending_end = (ev, now)
                else:
                    self.end(ev, st)
            else:
                text = event_line(ev)
                if text:
                    self.write(text)

    def settle(self, st: RunState, now: float, final: bool) -> None:
        """After each poll: the step line when due, incidents, a held-back end, a stopping state."""
        if now - self.last_print >= self.min_interval_s or final:
            self.step(st, now)
        self.incidents(st)
        if self.pending_end is not None and (final or st.exit_incident() is not None or now - self.pending_end[1] >= SETTLE_S):
            self.end(self.pending_end[0], st)
            self.pending_end = None
        if st.state != self.state_shown and st.state in ("stopping",):
            self.write(f"state: {st.state}")
        self.state_shown = st.state
        self.out.flush()


SETTLE_QUEUE_S = 5.0   # how often a pending run asks Slurm whether its job is still queued


def follow_run(run_dir: Path, out: TextIO, min_interval_s: float = 1.0, poll_s: float = 0.5,
               clock: Callable[[], float] = time.monotonic, since: tuple[int, float] | None = None) -> str:
    """Print progress until the run reaches a final state; returns that state.

    A step line at most every `min_interval_s` seconds (0: one per logged step); one line when an
    incident opens and one when it closes, from the engine or the supervisor. `since` = (bytes of
    events.jsonl, wall time) when a resume began: what was there before is read, not printed.
    """
    follower = _LineFollower(Path(run_dir))
    printer = _Printer(out, min_interval_s)
    if since is not None:
        offset, t0 = since
        follower.poll(max_bytes=offset)
        follower.folded.clear()
        printer.printed_step = follower.state.step
        printer.silent = {key for key, inc in incident_keys(follower.state) if not inc.t or inc.t < t0}
    next_settle, gone = clock(), None
    job, nodes_due = JobReader(Path(run_dir)), clock()
    while True:
        follower.poll()
        if clock() >= next_settle:
            # a Slurm job gone from the queue while its status waits or runs: over (no supervisor will write it)
            from tui.cluster.preempt import gone_status

            next_settle = clock() + SETTLE_QUEUE_S
            gone = gone_status(Path(run_dir))
        if gone is not None:
            apply_status(follower.state, gone)
        final = follower.state.state in FINAL_STATES
        if clock() >= nodes_due:   # a job's nodes, every NODES_EVERY_S: the node lines and troubled ranks
            nodes_due = clock() + NODES_EVERY_S
            for line, _ in node_lines(job.poll(), time.time(), 0, run=follower.state):
                printer.write(line)
        if final:   # the supervisor writes its verdict (incidents) before the final status
            follower.poll()
            if gone is not None:
                apply_status(follower.state, gone)
        st, now = follower.state, clock()
        folded, follower.folded = follower.folded, []
        printer.fold(folded, st, now, final)
        printer.settle(st, now, final)
        if final:
            why = st.first_failure() if st.state == "failed" else st.reason
            printer.write(f"run {st.state}{f' ({why})' if why else ''}: {run_dir}")
            out.flush()
            return st.state
        status = read_status(Path(run_dir))
        printer.job(status)
        if liveness(status) == "lost" and liveness(read_status(Path(run_dir))) == "lost":
            printer.write(f"run lost: its supervisor (pid {status.supervisor_pid}) is gone: {run_dir}")
            out.flush()
            return "lost"
        time.sleep(poll_s)


def resume_point(run_dir: Path) -> tuple[int, float]:
    """(bytes of events.jsonl, wall time) now: where a resumed run's new lines begin (`since`)."""
    try:
        size = RunPaths(Path(run_dir)).events.stat().st_size
    except OSError:
        size = 0
    return size, time.time()


class Detached(Exception):
    """The viewer let go of the run (Ctrl-C or a closed terminal); the run keeps going."""


def follow_headless(run_dir: Path, out: TextIO, every_s: float = 1.0,
                    since: tuple[int, float] | None = None) -> int:
    """follow_run with the signals a batch job sees; returns the exit code for `mt`.

    SIGTERM (SLURM time limit, preemption, `kill`) is passed to the supervisor as a graceful
    stop, so the run writes a final checkpoint, and we keep following until it has ended.
    Ctrl-C or a hang-up only detaches this viewer: the run keeps going.
    """
    def stop_run(_signum: int, _frame: object) -> None:
        pid = read_status(Path(run_dir)).supervisor_pid
        out.write("SIGTERM: stopping the run gracefully (final checkpoint)\n")
        if pid is not None:
            try:
                os.kill(pid, signal.SIGINT)   # mt's stop: under Slurm a SIGTERM would read as a preemption
            except ProcessLookupError:
                pass

    def detach(_signum: int, _frame: object) -> None:
        raise Detached

    old = {s: signal.signal(s, h) for s, h in ((signal.SIGTERM, stop_run), (signal.SIGINT, detach), (signal.SIGHUP, detach))}
    try:
        return exit_code_for(follow_run(Path(run_dir), out, min_interval_s=every_s, since=since))
    except Detached:
        try:
            out.write(f"detached; the run keeps going. Follow it: mt watch {run_dir}  stop it: mt stop {run_dir}\n")
            out.flush()
        except OSError:  # the terminal is gone
            pass
        return 130
    finally:
        for s, h in old.items():
            signal.signal(s, h)
