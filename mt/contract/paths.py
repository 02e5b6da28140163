"""Where everything lives inside a run directory (checkpoint folders: mt/contract/checkpoints.py)."""
from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    """Where everything lives inside one run directory."""

    root: Path

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
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def system(self) -> Path:
        return self.root / "system.jsonl"

    @property
    def incidents(self) -> Path:
        return self.root / "incidents.jsonl"

    @property
    def heartbeat_dir(self) -> Path:
        return self.root / "heartbeat"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeat_dir / f"rank{rank}"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

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
        return self.root / "supervisor.lock"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def stacks(self) -> Path:
        """One folder per stack capture (`mt stacks`): rank<N>.txt and verdict.json."""
        return self.root / "stacks"

    @property
    def reserve(self) -> Path:
        """Space the supervisor holds so it can record the final state on a full disk."""
        return self.root / ".reserve"


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
