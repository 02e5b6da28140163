"""`--headless`: follow a run and print compact progress lines until it ends.

At most one step line per `min_interval_s` (so SLURM / nohup logs stay small), plus one line
per checkpoint, eval, incident, control answer and attempt.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, TextIO

from mt.events import FINAL_STATES
from mt.records import Checkpoint, Control, Eval, Incident, Record, RunEnd, RunStart
from tui.format import fmt_duration, fmt_num, fmt_rate
from tui.read.follower import RunFollower
from tui.rundir import liveness, read_status
from tui.state.run import RunState


def step_line(st: RunState) -> str:
    total = "?" if st.max_steps is None else str(st.max_steps)
    width = len(total)
    return (f"step {st.step:>{width}}/{total}  loss {fmt_num(st.loss, '.4f')}  lr {fmt_num(st.lr, '.2e')}"
            f"  {fmt_rate(st.tokens_per_s, st.samples_per_s)}  ETA {fmt_duration(st.eta_s())}")


def event_line(ev: Record) -> str | None:
    """One line for a notable record, or None for those not worth a line."""
    if isinstance(ev, RunStart):
        frm = f", resuming from step {ev.start_step}" if ev.start_step else ""
        if ev.params_total is None:
            return f"attempt {ev.attempt} started{frm}"
        return f"attempt {ev.attempt} started: world {ev.world_size} x {ev.device}, {ev.params_total:,} params{frm}"
    if isinstance(ev, Eval):
        return f"eval  step {ev.step}  val_loss {fmt_num(ev.val_loss, '.4f')}"
    if isinstance(ev, Checkpoint):
        return f"checkpoint saved at step {ev.step} ({ev.reason}): {ev.path}"
    if isinstance(ev, Incident):
        return f"incident [{ev.severity}] {ev.code} at step {ev.step}: {ev.title}"
    if isinstance(ev, Control) and ev.status in ("done", "rejected"):
        return f"control {ev.action} {ev.status}: {ev.detail}".rstrip(": ")
    if isinstance(ev, RunEnd):
        return f"run ended at step {ev.step}: {ev.status} ({ev.reason})"
    return None


def exit_code_for(state: str) -> int:
    """0 for completed/stopped, 1 for anything else (failed, killed, lost)."""
    return 0 if state in ("completed", "stopped") else 1


def follow_run(run_dir: Path, out: TextIO, min_interval_s: float = 1.0, poll_s: float = 0.5,
               clock: Callable[[], float] = time.monotonic) -> str:
    """Print progress until the run reaches a final state; returns that state."""
    follower = RunFollower(Path(run_dir), keep_series=False)
    last_print = -float("inf")
    printed_step: int | None = None
    state_shown = None
    while True:
        res = follower.poll()
        st = follower.state
        now = clock()
        final = st.state in FINAL_STATES
        ends = [ev for ev in res.new_events if isinstance(ev, RunEnd)]
        for ev in res.new_events:
            line = event_line(ev) if not isinstance(ev, RunEnd) else None
            if line:
                out.write(line + "\n")
        if st.step is not None and st.step != printed_step and (now - last_print >= min_interval_s or final or ends):
            out.write(step_line(st) + "\n")
            last_print, printed_step = now, st.step
        for ev in ends:
            out.write(f"{event_line(ev)}\n")
        if st.state != state_shown and st.state in ("stopping",):
            out.write(f"state: {st.state}\n")
        state_shown = st.state
        out.flush()
        if final:
            reason = f" ({st.reason})" if st.reason else ""
            out.write(f"run {st.state}{reason}: {run_dir}\n")
            out.flush()
            return st.state
        status = read_status(Path(run_dir))
        if liveness(status) == "lost" and liveness(read_status(Path(run_dir))) == "lost":
            out.write(f"run lost: its supervisor (pid {status.get('supervisor_pid')}) is gone: {run_dir}\n")
            out.flush()
            return "lost"
        time.sleep(poll_s)


class Detached(Exception):
    """The viewer let go of the run (Ctrl-C or a closed terminal); the run keeps going."""


def follow_headless(run_dir: Path, out: TextIO) -> int:
    """follow_run with the signals a batch job sees; returns the exit code for `mt`.

    SIGTERM (SLURM time limit, preemption, `kill`) is passed to the supervisor as a graceful
    stop, so the run writes a final checkpoint, and we keep following until it has ended.
    Ctrl-C or a hang-up only detaches this viewer: the run keeps going.
    """
    def stop_run(_signum: int, _frame: object) -> None:
        pid = read_status(Path(run_dir)).get("supervisor_pid")
        out.write("SIGTERM: stopping the run gracefully (final checkpoint)\n")
        if isinstance(pid, int):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def detach(_signum: int, _frame: object) -> None:
        raise Detached

    old = {s: signal.signal(s, h) for s, h in ((signal.SIGTERM, stop_run), (signal.SIGINT, detach), (signal.SIGHUP, detach))}
    try:
        return exit_code_for(follow_run(Path(run_dir), out))
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
