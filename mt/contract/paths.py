"""Where everything lives inside a run directory (checkpoint folders: mt/contract/checkpoints.py)."""
from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from mt.contract import door

# The node a process belongs to in a job's shared run directory (Slurm's SLURMD_NODENAME); the
# supervisor sets it for its ranks, so a rank's heartbeat lands in its node's folder.
ENV_NODE = "MT_NODE"
# A node folder's name: what a host name may hold, never a path (a hostile `nodes/..` is skipped)
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def node_name_ok(name: str) -> bool:
    """Whether `name` can name a node's folder (a host name, no separators, not `.`/`..`)."""
    return bool(_NODE_NAME.fullmatch(name)) and name not in (".", "..")


def node_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """This process's node in a job's shared run directory (MT_NODE), None without one; a value
    that cannot name a node folder is ignored (the top), never a crash in a training process."""
    name = (os.environ if env is None else env).get(ENV_NODE) or ""
    return name if node_name_ok(name) else None


@dataclass(frozen=True)
class RunPaths:
    """Where everything lives inside one run directory.

    `node` None: one machine's files at the top (one node, or a run directory per node). A node's
    name: a job's shared run directory, where what rank 0 writes stays at the top (config, events,
    control, checkpoints, status.json of the job, incidents) and what this node's supervisor writes
    (system samples, heartbeats, logs, its own status, stacks, lock, reserve) is under nodes/<node>/."""

    root: Path
    node: str | None = None

    def __post_init__(self) -> None:
        if self.node is not None and not node_name_ok(self.node):
            raise ValueError(f"not a node name: {self.node!r}")

    @classmethod
    def of_process(cls, root: Path, env: Mapping[str, str] | None = None) -> RunPaths:
        """The run directory as a rank sees it: its node's folder from MT_NODE (set by its supervisor)."""
        return cls(Path(root), node_from_env(env))

    def on(self, node: str | None) -> RunPaths:
        """The same run directory seen from `node` (None: the top)."""
        return RunPaths(self.root, node)

    @property
    def nodes_dir(self) -> Path:
        return self.root / "nodes"

    @property
    def here(self) -> Path:
        """The folder of this node's supervisor files: the top, or nodes/<node>/."""
        return self.root if self.node is None else self.nodes_dir / self.node

    def node_names(self) -> list[str]:
        """The folders under nodes/ that can name a node, sorted; [] for a one-machine run directory,
        and for a `nodes` that is a link (to /proc or anywhere: no node is read through it)."""
        names = door.folder_names(self.nodes_dir, folders_only=True)
        return sorted(n for n in names if node_name_ok(n))

    @property
    def preset(self) -> Path:
        return self.root / "preset.toml"

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def node_status(self) -> Path:
        """This node's supervisor's own status: status.json at the top, or nodes/<node>/status.json."""
        return self.here / "status.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def system(self) -> Path:
        return self.here / "system.jsonl"

    @property
    def incidents(self) -> Path:
        return self.root / "incidents.jsonl"

    @property
    def heartbeat_dir(self) -> Path:
        return self.here / "heartbeat"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeat_dir / f"rank{rank}"

    @property
    def logs(self) -> Path:
        return self.here / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    @property
    def supervisor_log(self) -> Path:
        return self.logs / "supervisor.log"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def supervisor_lock(self) -> Path:
        return self.here / "supervisor.lock"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def rollback(self) -> Path:
        """The rollback the next attempt makes (mt/contract/rollback.py), kept until a checkpoint holds it."""
        return self.root / "rollback.json"

    @property
    def stacks(self) -> Path:
        """One folder per stack capture (`mt stacks`) of this node's ranks: rank<N>.txt and verdict.json."""
        return self.here / "stacks"

    @property
    def flight(self) -> Path:
        """PyTorch's flight-recorder dumps of this node's ranks (rank_<N>, written by torch on an NCCL timeout)."""
        return self.here / "flight"

    @property
    def stack_requests(self) -> Path:
        """Requests for every node's capture (`mt stacks` on a job's shared run directory), one file
        per request, written by the requester only; dot-named so rank 0's control inbox skips it."""
        return self.control / ".stacks"

    @property
    def mirror(self) -> Path:
        """How far the supervisor's TensorBoard mirror got ([monitor] tensorboard; tui/mirror/)."""
        return self.root / "mirror.json"

    @property
    def reserve(self) -> Path:
        """Space the supervisor holds so it can record the final state on a full disk."""
        return self.here / ".reserve"


def new_run_dir(runs_dir: Path, name: str, node_rank: int = 0) -> Path:
    """Create `<name>-<YYYYmmdd-HHMMSS>` (node_rank > 0 adds `-node<K>`) under runs_dir, 0700 and unique."""
    base = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}" + (f"-node{node_rank}" if node_rank else "")
    runs_dir.mkdir(parents=True, exist_ok=True)
    for i in range(1, 1000):
        path = runs_dir / (base if i == 1 else f"{base}.{i}")
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
        return path
    raise FileExistsError(errno.EEXIST, f"no free run directory name for {base}")
