"""Reading a run directory from outside: status, liveness, the newest run (checkpoints: mt/contract/checkpoints.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from mt.events import FINAL_STATES
from mt.jsonl import read_json
from mt.paths import RunPaths


class NotARunError(ValueError):
    """A path that is not an mt run directory; str() is the message for the user."""


def read_status(run_dir: Path) -> dict[str, Any]:
    """status.json as a dict ({} when missing or unreadable)."""
    status = read_json(RunPaths(Path(run_dir)).status)
    return status if isinstance(status, dict) else {}


def is_run_dir(path: Path) -> bool:
    """A run directory has a config.json written by `mt launch`."""
    return RunPaths(Path(path)).config.is_file()


def require_run_dir(path: Path) -> Path:
    """The path itself if it is a run directory, else NotARunError."""
    path = Path(path)
    if not path.is_dir():
        raise NotARunError(f"{path}: no such run directory")
    if not is_run_dir(path):
        raise NotARunError(f"{path}: not an mt run directory (no config.json)")
    return path


Liveness = Literal["starting", "live", "lost", "final"]


def supervisor_alive(status: dict[str, Any]) -> bool:
    """Whether the supervisor recorded in status.json is still running."""
    from tui.run.procs import pid_alive  # psutil: only paid for by commands that need it

    pid = status.get("supervisor_pid")
    return isinstance(pid, int) and not isinstance(pid, bool) and pid_alive(pid)


def liveness(status: dict[str, Any]) -> Liveness:
    """The one answer to "is this run live?", from status.json and the supervisor's process.

    final: its state is final. starting: launch wrote it and no supervisor has recorded itself
    yet. live: its supervisor runs. lost: it claims to be live but its supervisor is gone.
    """
    state = status.get("state")
    if state in FINAL_STATES:
        return "final"
    if not isinstance(state, str):
        return "lost"
    if not status.get("supervisor_pid"):
        return "starting"
    return "live" if supervisor_alive(status) else "lost"


def effective_state(status: dict[str, Any]) -> str:
    """The recorded state, or `lost` when it claims to be live but its supervisor is gone."""
    state = status.get("state")
    if not isinstance(state, str):
        return "unknown"
    return "lost" if liveness(status) == "lost" else state


def run_dirs(runs_dir: Path) -> list[Path]:
    """Sub-folders of runs_dir, newest first (by when launch wrote preset.toml, never rewritten)."""
    try:
        entries = [p for p in Path(runs_dir).iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []

    def key(p: Path) -> float:
        try:
            preset = RunPaths(p).preset
            return (preset if preset.exists() else p).stat().st_mtime
        except OSError:
            return 0.0

    return sorted(entries, key=key, reverse=True)


def newest_run(runs_dir: Path) -> Path | None:
    """The most recently created run directory under runs_dir."""
    for p in run_dirs(runs_dir):
        if is_run_dir(p):
            return p
    return None
