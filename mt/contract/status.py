"""status.json: the run's state as its supervisor (or rank 0 of a run mt.init made) records it.

`read_status` is the one reader (it never raises: a missing, torn or hostile file gives a
`Status` of defaults), `write_status` / `save_status` the one writer, and the state names and
their sets are defined here only. docs/run-directory.md lists the keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Literal

from mt.contract.events import as_int
from mt.contract.jsonl import read_json, write_json_atomic
from mt.contract.paths import RunPaths, node_name_ok
from mt.contract.space import is_disk_full

RUN_STATES = ("pending", "starting", "running", "stopping", "completed", "stopped", "failed", "killed")
LIVE_STATES = ("starting", "running", "stopping")
FINAL_STATES = ("completed", "stopped", "failed", "killed")
CLEAN_STATES = ("completed", "stopped")  # ended as asked: exit code 0, no failure to diagnose
# The one table of a run's transitions: every writer moves a Status with `move` or `end`, which
# refuse any other step (a final run starts again only through a resume: `starting` or `pending`).
NEXT_STATES: dict[str | None, tuple[str, ...]] = {
    None: RUN_STATES,   # no status.json yet, or one whose state is unreadable: any first word
    "pending": ("pending", "starting", *FINAL_STATES),
    "starting": ("starting", "running", "stopping", "pending", *FINAL_STATES),
    "running": ("running", "starting", "stopping", "pending", *FINAL_STATES),
    "stopping": ("stopping", "starting", "pending", *FINAL_STATES),
    **{final: ("starting", "pending", *FINAL_STATES) for final in FINAL_STATES},
}


class TransitionError(ValueError):
    """A move NEXT_STATES does not allow: a bug in mt, never the user's input."""
# pending: submitted to Slurm (`mt launch --slurm`), no supervisor yet: neither live nor final

Liveness = Literal["pending", "starting", "live", "lost", "final"]

# written only once set (docs: "added by the supervisor", "present after ...", "removed by mt resume")
_OPTIONAL = frozenset({"direct", "attempts", "restarts_left", "owner", "owner_cmdline", "slurm_job_id", "node",
                       "failures", "slurm_state", "job_nodes"})


@dataclass
class Status:
    """Every key of status.json, typed; a key the file lacks or holds a wrong type for is its default."""

    state: str | None = None
    attempt: int | None = None
    supervisor_pid: int | None = None
    torchrun_pid: int | None = None
    direct: bool | None = None
    worker_pids: dict[str, int] = field(default_factory=dict)
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    nproc: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    preset: str | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    restarts_left: int | None = None
    owner: str | None = None
    owner_cmdline: list[str] | None = None
    slurm_job_id: str | None = None
    node: str | None = None
    """The node whose supervisor wrote it (a job's shared run directory: nodes/<node>/status.json)."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    """This attempt's failed workers on that node, as torchrun reported them: rank, exit_code, pid."""
    slurm_state: str | None = None
    """Slurm's word on how the job's last attempt ended (CANCELLED, NODE_FAIL, REQUEUED, ...)."""
    job_nodes: list[str] = field(default_factory=list)
    """A job's nodes as Slurm allocated them (the job's status only): the node folders that count."""
    # not keys of the file: what reading it found
    found: bool = field(default=False, compare=False)
    """The file was there and held a JSON object."""
    invalid: frozenset[str] = field(default=frozenset(), compare=False)
    """Keys the file has with a value of the wrong type (read as their default)."""
    written: float | None = field(default=None, compare=False)
    """The file's mtime: every pid it names was running by then."""

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def ended_well(self) -> bool:
        return self.state in CLEAN_STATES

    @property
    def by_script(self) -> bool:
        """Made by mt.init under plain python/torchrun: rank 0 stands in for the supervisor."""
        return self.owner == "script"

    def recorded_pids(self) -> list[int]:
        """torchrun and worker pids of every attempt it recorded (a hint: any may be reused)."""
        pids = [self.torchrun_pid, *self.worker_pids.values(), *(a.get("torchrun_pid") for a in self.attempts)]
        return [p for p in pids if _pid(p) is not None]

    def move(self, state: str, reason: str | None = None) -> None:
        """The one way a run's state changes (NEXT_STATES); `reason` replaces the old one when given."""
        if state not in NEXT_STATES.get(self.state, ()):
            raise TransitionError(f"status.json: {self.state} -> {state} is not a transition (mt/contract/status.py NEXT_STATES)")
        self.state = state
        if reason is not None:
            self.reason = reason

    def end(self, state: str, reason: str, now: float, exit_code: int | None) -> None:
        """The last transition of an attempt (or of the run), closing the attempt still open."""
        self.move(state, reason)
        self.ended, self.exit_code = now, exit_code
        for a in self.attempts:
            if a.get("ended") is None:
                a.update(ended=now, exit_code=exit_code)

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object (an optional key only once it has a value)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.compare:
                value = getattr(self, f.name)
                if f.name not in _OPTIONAL or value not in (None, []):
                    out[f.name] = value
        return out

    @classmethod
    def parse(cls, raw: Any) -> "Status":
        """A Status from status.json's JSON value, whatever it holds."""
        if not isinstance(raw, dict):
            return cls()
        bad: set[str] = set()

        def get(key: str, check: Any, default: Any = None) -> Any:
            value = raw.get(key)
            if value is None:
                return default
            got = check(value)
            if got is None:
                bad.add(key)
                return default
            return got

        attempts = get("attempts", lambda v: [a for a in v if isinstance(a, dict)] if isinstance(v, list) else None, [])
        return cls(
            state=get("state", _state), attempt=get("attempt", as_int), supervisor_pid=get("supervisor_pid", _pid),
            torchrun_pid=get("torchrun_pid", _pid), direct=get("direct", _bool),
            worker_pids=get("worker_pids", _pids, {}), started=get("started", _num), ended=get("ended", _num),
            exit_code=get("exit_code", as_int), reason=get("reason", _str), nproc=get("nproc", as_int),
            nnodes=get("nnodes", as_int), node_rank=get("node_rank", as_int), preset=get("preset", _str),
            attempts=attempts, restarts_left=get("restarts_left", as_int), owner=get("owner", _str),
            owner_cmdline=get("owner_cmdline", _strs), slurm_job_id=get("slurm_job_id", _job_id),
            node=get("node", lambda v: v if isinstance(v, str) and node_name_ok(v) else None),
            failures=get("failures", _failures, []), slurm_state=get("slurm_state", _str),
            job_nodes=get("job_nodes", _node_names, []), found=True, invalid=frozenset(bad))


def judge(status: Status, supervisor_alive: Callable[[Status], bool]) -> Liveness:
    """The one answer to "is this run live?"; `supervisor_alive` is asked only when it decides
    (tui/read/rundir.py `liveness` asks the process table; the rules, inside the supervisor, know).

    final: its state is final. pending: queued in Slurm, no supervisor yet (a supervisor_pid it
    claims is not trusted: only the job's own supervisor writes one, with another state). starting: launch wrote it and no supervisor has recorded itself
    yet. live: its supervisor runs. lost: it claims to be live but its supervisor is gone, or
    the file says nothing a reader may trust (no state, a pid that is not one).
    """
    if status.is_final:
        return "final"
    if status.state == "pending":
        return "pending"
    if status.state is None or "supervisor_pid" in status.invalid:
        return "lost"
    if status.supervisor_pid is None:
        return "starting"
    return "live" if supervisor_alive(status) else "lost"


def read_status(run_dir: Path, node: str | None = None) -> Status:
    """The run's status.json, or with `node` that node's supervisor's (defaults when it is missing or unreadable); never raises."""
    path = RunPaths(Path(run_dir), node).node_status
    try:
        written: float | None = path.stat().st_mtime
    except OSError:
        written = None
    status = Status.parse(read_json(path))
    status.written = written
    return status


def write_status(paths: RunPaths, status: Status, node_only: bool = False) -> None:
    """status.json, atomically (renamed into place: a reader never sees half of it); with a node,
    its nodes/<node>/status.json too, or (`node_only`, a node that is not the job's) only that."""
    if paths.node is not None:
        paths.here.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_json_atomic(paths.node_status, status.to_dict())
    if paths.node is None or not node_only:
        write_json_atomic(paths.status, status.to_dict())


def save_status(paths: RunPaths, status: Status, node_only: bool = False) -> bool:
    """write_status, deleting the run's `.reserve` to make room on a full disk (what it is for:
    the run's last state); True when it did. OSError when even that leaves no room."""
    try:
        write_status(paths, status, node_only)
        return False
    except OSError as e:
        if not is_disk_full(e) or not paths.reserve.exists():
            raise
    paths.reserve.unlink()
    write_status(paths, status, node_only)
    return True


def _state(v: Any) -> str | None:
    return v if v in RUN_STATES else None


def _job_id(v: Any) -> str | None:
    return v if isinstance(v, str) and v.isdigit() and v.isascii() else None   # squeue -j takes it as is


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _pid(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _pids(v: Any) -> dict[str, int] | None:
    if not isinstance(v, dict):
        return None
    return {str(r): p for r, p in v.items() if str(r).isdigit() and _pid(p) is not None}


def _failures(v: Any) -> list[dict[str, Any]] | None:
    if not isinstance(v, list):
        return None
    return [{k: as_int(f.get(k)) for k in ("rank", "exit_code", "pid")}
            for f in v if isinstance(f, dict) and as_int(f.get("rank")) is not None]


def _node_names(v: Any) -> list[str] | None:
    """A list of node names, each once; None (invalid) when any entry cannot name a node folder."""
    if not isinstance(v, list) or not all(isinstance(n, str) and node_name_ok(n) for n in v):
        return None
    return list(dict.fromkeys(v))


def _strs(v: Any) -> list[str] | None:
    return list(v) if isinstance(v, list) and all(isinstance(a, str) for a in v) else None
