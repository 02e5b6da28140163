"""`mt launch --slurm`: the batch script, its submission with sbatch, and what a supervisor inside
the allocation takes from Slurm (node identity, nnodes, rendezvous). docs/presets.md ([slurm]),
docs/run-directory.md (slurm/).

Written by hand rather than with submitit: submitit pickles a Python callable into its own folder
layout and runs it with its own requeue logic, while a run here is a run directory and a command
(`python -m tui.supervise.supervisor_main --slurm`); a batch script of a dozen lines needs no dependency.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from mt.contract.config import Config, LaunchConfig
from mt.contract.paths import RunPaths, node_name_ok
from mt.contract.preset import control_char, sbatch_option
from mt.contract.status import read_status, write_status

if TYPE_CHECKING:
    pass

SUBMIT_TIMEOUT_S = 60.0
QUERY_TIMEOUT_S = 5.0   # squeue/sacct for a view (mt ls, mt watch): a slow slurmctld must not hang it
PORT_BASE, PORT_SPAN = 20000, 20000   # the c10d port of a job: PORT_BASE + job id mod PORT_SPAN


class SlurmError(RuntimeError):
    """A Slurm command is missing or failed; str() is the one line for the user (exit 2)."""


@dataclass
class Submitted:
    """What `mt launch --slurm` reports: where the run is and which job runs it."""

    run_dir: Path
    job_id: str
    held: bool


def job_dir(run_dir: Path) -> Path:
    """RUN/slurm: the batch script and the job's output."""
    return Path(run_dir) / "slurm"


def batch_script(cfg: Config, run_dir: Path, python: str = sys.executable) -> str:
    """The job script: #SBATCH lines from [slurm] and the shape, then one supervisor per node under srun."""
    s, launch = cfg.slurm, cfg.launch
    out = sbatch_path(job_dir(run_dir), "job-%j.out")
    # --requeue: a preempted run's supervisor requeues the job after its checkpoint (tui/cluster/preempt.py);
    # append: every attempt's output in the one file of the job
    opts = [f"--job-name={cfg.run.name}", f"--nodes={launch.nnodes}", "--ntasks-per-node=1", f"--output={out}",
            "--requeue", "--open-mode=append"]
    for key, flag in (("partition", "partition"), ("time", "time"), ("account", "account"), ("qos", "qos")):
        if getattr(s, key):
            opts.append(f"--{flag}={getattr(s, key)}")
    if s.gpus_per_node:
        opts.append(f"--gpus-per-node={s.gpus_per_node}")
    if s.cpus_per_task:
        opts.append(f"--cpus-per-task={s.cpus_per_task}")
    if s.signal_grace_s:
        # B: the batch shell gets it, not every task: the supervisor's own SIGUSR1 means "kill"
        opts.append(f"--signal=B:USR1@{s.signal_grace_s}")
    opts += [sbatch_option(x) for x in s.extra]
    sup = [python, "-P", "-m", "tui.supervise.supervisor_main", "--run-dir", str(run_dir), "--slurm"]
    lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in opts),
             f"# mt run {shlex.quote(str(run_dir))} (mt launch --slurm); the supervisor runs in the foreground of each node's task",
             f"cd {shlex.quote(cfg.run.workdir or str(run_dir))}",
             # the time-limit warning (USR1, to this shell only) becomes every node's supervisor's
             # graceful stop (SIGTERM to the step's tasks; a TERM to srun itself would kill the step).
             # A cancel or preemption sends the tasks TERM itself: this shell only waits on.
             "trap 'scancel --signal=TERM \"$SLURM_JOB_ID.0\"' USR1",
             "trap ':' TERM",
             # through `bash -c` as one word: srun's own command line must not name the run
             # (`--run-dir RUN`), or the supervisor would take srun for a leftover of its run and end it
             f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {shlex.quote('exec ' + shlex.join(sup))} &",
             "step=$!",
             "wait \"$step\"; rc=$?",
             "while kill -0 \"$step\" 2>/dev/null; do wait \"$step\"; rc=$?; done  # a trapped signal ends wait early",
             "exit $rc", ""]
    return "\n".join(lines)


def sbatch_path(path: Path, file: str) -> str:
    """`path/file` as one argument of an #SBATCH line, which sbatch splits itself (not a shell:
    src/sbatch/opt.c get_argument): in double quotes when it holds whitespace, a quote or `#` (a
    backslash does not keep a space there), `"` behind a backslash, `%` of the path doubled (`file`'s
    %j is the pattern). SlurmError for what no #SBATCH line can carry: a control character (a
    newline ends the line) or a backslash (in a file name pattern it turns %j off)."""
    text = str(path)
    bad = control_char(text)
    if bad is not None or "\\" in text:
        why = bad or "a backslash, which Slurm's file name patterns take as 'no %j here'"
        raise SlurmError(f"{json.dumps(text)}: {why}: a Slurm job's output cannot go there; use another runs_dir")
    word = text.replace("%", "%%") + "/" + file
    if not any(c.isspace() or c in "\"'#" for c in word):
        return word
    escaped = word.replace('"', '\\"')
    return f'"{escaped}"'


def require_sbatch() -> None:
    """sbatch must be on PATH before a run directory is made for it."""
    if shutil.which("sbatch") is None:
        raise SlurmError("mt launch --slurm: sbatch not found on PATH (is this a Slurm login node?)")


def _slurm(*args: str, timeout_s: float = SUBMIT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]}: not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{args[0]}: no answer in {timeout_s:.0f} s (is slurmctld up?)") from None


def _failed(what: str, done: subprocess.CompletedProcess[str]) -> SlurmError:
    why = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return SlurmError(f"{what} failed (exit {done.returncode}): {why[-1] if why else 'no message'}")


def submit(cfg: Config, run_dir: Path) -> Submitted:
    """Write RUN/slurm/job.sh, submit it held, record the job id in status.json (state pending), release it.

    Held first: a job that started at once could write `starting` before we write its id.
    """
    paths = RunPaths(run_dir)
    folder = job_dir(run_dir)
    folder.mkdir(mode=0o700, exist_ok=True)
    script = folder / "job.sh"
    script.write_text(batch_script(cfg, run_dir), encoding="utf-8")
    os.chmod(script, 0o700)
    held = any(sbatch_option(x).split("=")[0] in ("--hold", "-H") for x in cfg.slurm.extra)
    done = _slurm("sbatch", "--parsable", "--hold", str(script))
    if done.returncode != 0:
        raise _failed(f"sbatch {script}", done)
    job_id = done.stdout.strip().split(";")[0]   # --parsable: "ID" or "ID;cluster"
    if not job_id.isdigit():
        raise SlurmError(f"sbatch {script}: expected a job id, got {done.stdout.strip()!r}")
    status = read_status(run_dir)
    status.move("pending", "submitted to Slurm")
    status.slurm_job_id = job_id
    write_status(paths, status)
    if not held:
        released = _slurm("scontrol", "release", job_id)
        if released.returncode != 0:
            raise _failed(f"scontrol release {job_id}", released)
    return Submitted(run_dir, job_id, held)


def cancel_quietly(job_id: str) -> None:
    """Best effort: a job whose run directory could not be completed must not run."""
    try:
        _slurm("scancel", job_id)
    except SlurmError:
        pass


def queue_state(job_id: str) -> str | None:
    """Slurm's word on the job, `PENDING (JobHeldUser)`; "" once squeue no longer lists it;
    None without squeue (or when it fails)."""
    states = queue_states([job_id])
    return None if states is None else states.get(job_id, "")


def queue_states(job_ids: list[str]) -> dict[str, str] | None:
    """One squeue for many jobs: id -> `RUNNING` or `PENDING (JobHeldUser)`, for the jobs it still
    lists; None without squeue (or when it fails)."""
    if not job_ids:
        return {}
    try:
        done = _slurm("squeue", "-h", "-j", ",".join(job_ids), "-o", "%i,%T,%r", timeout_s=QUERY_TIMEOUT_S)
    except SlurmError:
        return None
    if done.returncode != 0:
        # squeue exits 1 with "Invalid job id specified" for a job it has forgotten
        return {} if "Invalid job id" in done.stderr else None
    out = {}
    for line in done.stdout.splitlines():
        job, _, rest = line.strip().partition(",")
        state, _, reason = rest.partition(",")
        if job in job_ids and state:
            out[job] = f"{state} ({reason})" if reason and reason != "None" else state
    return out


def accounted_states(job_ids: list[str]) -> dict[str, str]:
    """sacct's final word (COMPLETED, CANCELLED by 0, ...) on jobs squeue no longer lists; {} without
    accounting (sacct missing, or the cluster keeps none)."""
    if not job_ids:
        return {}
    try:
        done = _slurm("sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,State", timeout_s=QUERY_TIMEOUT_S)
    except SlurmError:
        return {}
    pairs = (line.split("|", 1) for line in done.stdout.splitlines() if "|" in line) if done.returncode == 0 else ()
    return {job: state.strip() for job, state in pairs if job in job_ids and state.strip()}


def dry_run_dir(cfg: Config) -> Path:
    """The run directory a submission now would get (`--dry-run` makes none)."""
    runs_dir = Path(cfg.run.runs_dir).expanduser().resolve()
    return runs_dir / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def rendezvous_port(job_id: str) -> int:
    """One port per job, the same on every node without asking anyone: PORT_BASE + id mod PORT_SPAN
    (20000-39999: above the well-known and registered services most clusters run, below Linux's
    default ephemeral range 32768-60999 only in part, so two jobs on one node rarely meet)."""
    return PORT_BASE + int(job_id) % PORT_SPAN if job_id.isdigit() else PORT_BASE


def hostnames(nodelist: str) -> list[str]:
    """A Slurm node list's names (`n[1-2]` -> n1, n2), as `scontrol show hostnames` expands it ([] when it cannot)."""
    if not nodelist:
        return []
    try:
        done = _slurm("scontrol", "show", "hostnames", nodelist)
    except SlurmError:
        return []
    return done.stdout.split() if done.returncode == 0 else []


def first_host(nodelist: str) -> str:
    """The first node of SLURM_JOB_NODELIST (`n[1-2]` -> n1)."""
    names = hostnames(nodelist)
    return names[0] if names else nodelist.split(",")[0]


def node_addr(node: str) -> str:
    """Where the other nodes reach `node`: its NodeAddr in slurm.conf (`scontrol show node`), which
    is the node's name on most clusters and 127.0.0.1 for the test cluster's n1/n2; the name without it."""
    try:
        done = _slurm("scontrol", "show", "node", "-o", node)
    except SlurmError:
        return node
    for word in done.stdout.split() if done.returncode == 0 else []:
        key, _, value = word.partition("=")
        if key == "NodeAddr" and value and value != "(null)":
            return value
    return node


def slurm_node(env: Mapping[str, str]) -> str | None:
    """This supervisor's node folder in the job's shared run directory: SLURMD_NODENAME (never the
    host name: nodes may share one) for a job of several nodes; None for one node (today's layout)."""
    nnodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
    name = env.get("SLURMD_NODENAME") or ""
    if nnodes <= 1:
        return None
    if not node_name_ok(name):
        raise SlurmError(f"SLURMD_NODENAME {name!r} cannot name a node folder")
    return name


def slurm_launch(launch: LaunchConfig, env: Mapping[str, str]) -> LaunchConfig:
    """[launch] as this node of the allocation runs it: nnodes and node rank from Slurm, and with
    several nodes the rendezvous on the first node (its NodeAddr) at the job's port (one node: today's loopback)."""
    nnodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or launch.nnodes)
    node_rank = int(env.get("SLURM_NODEID") or 0)
    endpoint = launch.rdzv_endpoint
    if nnodes > 1:
        first = node_addr(first_host(env.get("SLURM_JOB_NODELIST", "")))
        endpoint = f"{first}:{rendezvous_port(env.get('SLURM_JOB_ID', ''))}"
    return dataclasses.replace(launch, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=endpoint)
