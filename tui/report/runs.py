"""Plain-text views of runs for `mt ls`, `mt watch --once` and `mt watch A B --once` (built on tui.state.runstate.RunState)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tui.format.fmt import NA, fmt_best, fmt_best_checkpoints, fmt_duration, fmt_epoch, fmt_loss_cell, fmt_step, or_na, safe_text
from tui.read.follower import load_run_state
from tui.read.nodes import JobReader
from tui.read.rundir import effective_state, is_run_dir, run_dirs
from tui.report.nodes import node_lines
from tui.report.summary import format_summary
from tui.state.compare import run_line, table_rows
from tui.state.runstate import apply_status

ONCE_NODE_LINES = 66   # --once lists every rank of a job up to 64 ranks on one node; beyond, only troubled ones

if TYPE_CHECKING:
    from tui.state.answers import ControlAnswer


@dataclass
class RunRow:
    """One line of `mt ls`."""

    name: str
    state: str
    attempt: str = "-"
    step: str = "-"
    loss: str = "-"
    best: str = "-"
    started: str = "-"
    duration: str = "-"
    best_ckpt: str = ""
    """The best checkpoints kept ([checkpoint] keep_best), best first; a column only when a row has one."""
    slurm: str = ""
    """A Slurm run's job id and Slurm's state for it (`1234 PENDING (JobHeldUser)`); "" for any other."""
    best_loss: float | None = None   # what --sort loss orders by; not a column
    job_id: str | None = None        # status.json's slurm_job_id; not a column
    path: Path | None = None         # the run directory; not a column


COLUMNS = ("name", "state", "attempt", "step", "loss", "best", "started", "duration")
SORTS = ("started", "loss", "name")   # `mt ls --sort`; started (newest first) is the default


def run_row(path: Path, now: float | None = None) -> RunRow:
    """The row for one folder; a foreign or broken folder says so instead of raising."""
    now = time.time() if now is None else now
    if not is_run_dir(path):
        return RunRow(path.name, "(not a run)")
    try:
        # a big run with an index: its tail only (ms, no numpy); its best is then marked partial
        st = load_run_state(path, exact_best=False)
        state = effective_state(st.status) if st.status.found else "(no status)"
        state += f", rolled back {st.rollbacks}x" if st.rollbacks else ""
        return RunRow(
            name=path.name,
            state=state,
            attempt=or_na(st.attempt),
            step=fmt_step(st.step, st.max_steps) + fmt_epoch(st.epoch, " ep "),
            loss=fmt_loss_cell(st.loss),
            best=fmt_best(st.best_loss, st.best_loss_step, st.best_loss_partial),
            started=time.strftime("%Y-%m-%d %H:%M", time.localtime(st.started)) if st.started else NA,
            duration=fmt_duration(st.elapsed_s(now)) if st.started else NA,
            best_loss=st.best_loss, job_id=st.status.slurm_job_id, path=path,
            best_ckpt=fmt_best_checkpoints(st.best_metric, st.best_checkpoints),
            slurm=f"{st.status.slurm_job_id} {state}" if st.status.slurm_job_id else "",
        )
    except Exception as e:  # noqa: BLE001 - one broken run directory must not break `mt ls`
        return RunRow(path.name, f"(broken: {type(e).__name__})")


def sorted_rows(rows: list[RunRow], sort: str) -> list[RunRow]:
    """Rows (newest first as given) by `sort`: lowest best loss first (runs without one last, newest
    first among them), or by name; "started" keeps the order."""
    if sort == "loss":
        return sorted(rows, key=lambda r: (r.best_loss is None, r.best_loss or 0.0))   # stable: newest first on ties
    if sort == "name":
        return sorted(rows, key=lambda r: r.name)
    if sort != "started":
        raise ValueError(f"unknown sort {sort!r}: one of {', '.join(SORTS)}")
    return rows


def runs_table(runs_dir: Path, sort: str = "started") -> str:
    """The `mt ls` table, newest run first (or by best loss, or by name)."""
    rows = sorted_rows([run_row(p) for p in run_dirs(runs_dir)], sort)
    if not rows:
        return f"no runs in {runs_dir}"
    columns = COLUMNS + (("best_ckpt",) if any(r.best_ckpt for r in rows) else ()) + (("slurm",) if with_slurm_states(rows) else ())
    header = RunRow("NAME", "STATE", "ATTEMPT", "STEP", "LOSS", "BEST", "STARTED", "DURATION", best_ckpt="BEST CKPT", slurm="SLURM")
    table = [{c: safe_text(getattr(r, c)) for c in columns} for r in (header, *rows)]   # a folder's name is anyone's
    widths = {c: max(len(r[c]) for r in table) for c in columns}
    return "\n".join("  ".join(r[c].ljust(widths[c]) for c in columns).rstrip() for r in table)


def with_slurm_states(rows: list[RunRow]) -> bool:
    """Fill the SLURM cell of the Slurm runs with Slurm's state (one squeue, then sacct for the jobs it
    no longer lists; without them the cell keeps status.json's state); False when no row is one."""
    from tui.cluster.slurm import accounted_states, queue_states

    ids = [r.job_id for r in rows if r.job_id]
    if not ids:
        return False
    queued = queue_states(ids)
    known = {**(queued or {}), **accounted_states([j for j in ids if j not in (queued or {})] if queued is not None else [])}
    for r in rows:
        if r.job_id in known:
            r.slurm = f"{r.job_id} {known[r.job_id]}"
        elif r.job_id and queued is not None:
            r.slurm = f"{r.job_id} (not in the queue)"
        if r.job_id and queued is not None and r.job_id not in queued and r.path is not None:
            from tui.cluster.preempt import gone_status

            gone = gone_status(r.path)   # waits or runs by its status, but its job is gone: Slurm's word, shown
            r.state = gone.state or r.state if gone is not None else r.state
    return True


def run_summary(run_dir: Path) -> str:
    """`mt watch --once`: the dashboard's facts as plain text."""
    from tui.cluster.preempt import gone_status

    st = load_run_state(Path(run_dir))
    gone = gone_status(Path(run_dir))   # a Slurm job that left the queue: Slurm's word, shown (not written)
    if gone is not None:
        apply_status(st, gone)
    st.supervisor_lost = effective_state(st.status) == "lost"   # no ETA, and `lost` in place of its state
    text = format_summary(st)
    if st.supervisor_lost:
        text += f"\nwarning: status says {safe_text(st.state)}, but its supervisor is gone (state lost)"
    if st.status.state == "pending":
        text += "\n" + safe_text(pending_line(st.status.slurm_job_id))   # the job id is status.json's, the reason squeue's
    job = JobReader(Path(run_dir))
    nodes = job.poll()
    if nodes:   # a job's shared run directory: every node and its ranks (and once, any folder that is not the job's)
        text += "\n" + "\n".join(line for line, _ in node_lines(nodes, time.time(), ONCE_NODE_LINES, job.strays, st))
    return text


def pending_line(job_id: str | None) -> str:
    """What a queued run waits for, in Slurm's words (squeue), or why that is not known."""
    from tui.cluster.slurm import queue_state

    if job_id is None:
        return "pending: submitted to Slurm, no job id recorded"
    got = queue_state(job_id)
    if got is None:
        return f"pending: Slurm job {job_id} (squeue not available here to say why)"
    if not got:
        return f"pending: Slurm job {job_id} is no longer in the queue and never started (cancelled?)"
    return f"pending: Slurm job {job_id} {got}"


def compare_table(paths: list[Path]) -> str:
    """`mt watch A B --once`: the compare view's header as plain text."""
    lines = []
    for run_dir in paths:
        st = load_run_state(Path(run_dir))
        line = run_line(Path(run_dir).name, st)
        if st.status.found:
            line.state = effective_state(st.status)   # lost when the supervisor is gone
        lines.append(line)
    return "\n".join("  ".join(r).rstrip() for r in table_rows(lines))


def checkpoint_line(step: int, path: str) -> str:
    """`checkpoint saved at step S: PATH`, as `mt ckpt` and `mt stop` end."""
    return f"checkpoint saved at step {step}: {path}"


def last_checkpoint_line(run_dir: Path) -> str:
    """The run's newest checkpoint as `checkpoint_line` (or that there is none)."""
    st = load_run_state(Path(run_dir), exact_best=False)
    ck = st.last_checkpoint
    if ck is None:
        return "no checkpoint was written"
    return checkpoint_line(ck.step, ck.path)


def answer_line(answer: ControlAnswer) -> str:
    """What `mt ckpt` prints of the engine's answer: the checkpoint it saved, or why not."""
    ck = answer.checkpoint
    if answer.status == "done" and ck:
        return checkpoint_line(ck.step, ck.path)
    detail = f": {answer.detail}" if answer.detail else ""
    return f"{answer.action or 'request'} {answer.status}{detail}"
