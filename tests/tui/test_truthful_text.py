"""What the viewer says must hold: no 'reports nothing' before a script had time to report, no ETA
on a stalled run, no heartbeat step behind the step events, `mt kill`'s line after Slurm ended it all."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from mt.contract.heartbeat import Heartbeat
from mt.contract.paths import RunPaths
from mt.contract.status import Status, write_status
from tests.tui.jobdir import two_nodes
from tests.tui.synth import running_run
from tui.read.follower import load_run_state
from tui.read.nodes import JobReader
from tui.report.nodes import node_lines
from tui.report.runs import run_summary
from tui.report.summary import format_summary
from tui.supervise.control import kill_summary
from tui.supervise.procs import SignalReport
from tui.widgets.header import render_header
from tui.widgets.notice import notice_text


def _script_run(root: Path, state: str = "running", attempt: int = 1) -> RunPaths:
    """A script run's directory as the supervisor keeps it, no step yet (this process stands in for its processes)."""
    paths = RunPaths(root)
    root.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(json.dumps({"run": {"name": "train"}, "launch": {"script": "train.py", "nproc_per_node": 1}}))
    paths.events.touch()
    final = state in ("completed", "failed", "killed", "stopped")
    write_status(paths, Status(state=state, attempt=attempt, supervisor_pid=os.getpid(), torchrun_pid=os.getpid(),
                               started=time.time() - 5, ended=time.time() if final else None))
    return paths


def test_a_script_is_said_to_report_nothing_only_once_its_attempt_ended_without_mt_init(tmp_path: Path) -> None:
    paths = _script_run(tmp_path / "run")
    # before mt.init (importing torch, loading data): no step yet, not "reports nothing"
    st = load_run_state(paths.root)
    said = format_summary(st) + str(notice_text(st, [], None))
    assert "reports nothing" not in said and "reported nothing" not in said, said
    assert "No step yet: the script has not called mt.init in this attempt" in str(notice_text(st, [], None))
    # mt.init made its first beat: it reports through mt, its first run.step is what comes next
    Heartbeat(paths.heartbeat(0), 0, 1).beat(0, "start")
    st = load_run_state(paths.root)
    assert st.script_hint() is None
    assert str(notice_text(st, [], None)) == "Starting: waiting for the script's first run.step…"
    # a heartbeat of the attempt before is no word on this one
    paths = _script_run(tmp_path / "run", attempt=2)
    assert load_run_state(paths.root).script_hint().startswith("no step yet")
    # an attempt that ended with no heartbeat and no step: now it is known
    paths = _script_run(tmp_path / "bare", state="completed")
    assert format_summary(load_run_state(paths.root)).splitlines()[-1].startswith("this script reported nothing through mt")


def _eta(root: Path, now: float) -> str:
    """The ETA as `mt watch --once` and the header say it at `now`."""
    st = load_run_state(root)
    first = format_summary(st, now).splitlines()[0]
    header = render_header(st, now, 200, 0.0, False).plain
    said = first.split("ETA ", 1)[1]
    assert f"ETA {said}" in header, (said, header)
    return said


def test_no_eta_is_given_for_a_run_that_stopped_stepping(tmp_path: Path) -> None:
    r = running_run(tmp_path / "run", steps=20, max_steps=100)   # a step event every 0.5 s, 80 to go: ~40 s
    r.status("running", reason=None)
    last = r.t
    assert _eta(r.root, last + 1) == "40s"
    # quiet for less than the run's own limit (max(hang_floor_s 30 s, 20 x 0.5 s)): a pause, not a stall
    assert _eta(r.root, last + 25) == "40s"
    # quiet for 6 minutes: no rate holds any more, and the line says for how long
    assert _eta(r.root, last + 362) == "— (no step for 6m02s)"
    # the run's own [monitor] limits: a hang floor of 5 s
    cfg = json.loads(r.paths.config.read_text())
    r.paths.config.write_text(json.dumps({**cfg, "monitor": {"hang_floor_s": 5.0}}))
    assert _eta(r.root, last + 12) == "— (no step for 12s)"
    # an open hang incident says it at once
    r.paths.config.write_text(json.dumps(cfg))
    r.event("incident", step=21, code="hang", severity="error", title="Hang: no progress after step 20",
            detail="no step", advice="", evidence={})
    r.flush()
    assert _eta(r.root, r.t + 1).startswith("— (no step for")


def test_no_rank_is_shown_behind_the_newest_step_event(tmp_path: Path) -> None:
    job = two_nodes(tmp_path / "job", steps=199)
    # step 200's event is out (every rank passed its collective); rank 2's beat of it is not read yet
    job.step(200, ranks=[0, 1, 3])
    # rank 3's file holds a beat of another attempt: its own word, not lifted to this attempt's step
    Heartbeat(job.paths.on("n2").heartbeat(3), 3, 7).beat(150)
    job.close()
    assert "  r2 step 200 " in run_summary(job.paths.root)   # `mt watch --once`
    st = load_run_state(job.paths.root)
    lines = [line for line, _ in node_lines(JobReader(job.paths.root).poll(), time.time(), 40, run=st)]
    cells = {line.split()[0]: line.split()[2] for line in lines if line.startswith("  r")}
    assert cells == {"r0": "200", "r1": "200", "r2": "200", "r3": "150"}, lines
    assert [line.split(" step ")[1].split()[0] for line in lines if line.startswith("n")] == ["200", "150-200"], lines


def test_mt_kills_line_says_what_ended_the_processes() -> None:
    assert kill_summary(SignalReport(terminated=[11, 12], killed=[12], state="killed")) == \
        "killed: 2 process(es) terminated, 1 needed SIGKILL; state killed"
    # a Slurm job: scancel ended its processes on every node, none was left here
    assert kill_summary(SignalReport(state="killed (Slurm job 42 cancelled)", cancelled="42")) == \
        "killed: no process left to terminate here (Slurm ended the processes of job 42); state killed (Slurm job 42 cancelled)"
    assert kill_summary(SignalReport(state="killed")) == "killed: no process left to terminate (they had exited); state killed"
