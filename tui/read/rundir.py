"""Reading a run directory from outside: liveness, the newest run (status: mt/contract/status.py; checkpoints: mt/contract/checkpoints.py)."""
from __future__ import annotations

from pathlib import Path

from mt.contract import door
from mt.contract.fmt import NA
from mt.contract.paths import RunPaths
from mt.contract.status import Liveness, Status, judge


class NotARunError(ValueError):
    """A path that is not an mt run directory; str() is the message for the user."""


def is_run_dir(path: Path) -> bool:
    """A run directory has a config.json written by `mt launch`."""
    return door.is_regular(RunPaths(Path(path)).config)


def _config_missing(config: Path) -> str:
    """Why config.json does not make a run directory: missing, or what the door says it is instead."""
    try:
        door.read_head(config, 0)
    except FileNotFoundError:
        return "no config.json"
    except OSError as e:
        return f"config.json: {str(e).removeprefix(f'{config}: ')}"
    return "no config.json"


def require_run_dir(path: Path) -> Path:
    """The path itself if it is a run directory, else NotARunError."""
    path = Path(path)
    if not path.is_dir():
        raise NotARunError(f"{path}: no such run directory")
    if not is_run_dir(path):
        raise NotARunError(f"{path}: not an mt run directory ({_config_missing(RunPaths(path).config)})")
    return path


def supervisor_alive(status: Status) -> bool:
    """Whether the process recorded as the run's supervisor still runs (and is that process:
    one started after status.json named it is another program that reused the pid)."""
    from tui.read.procs import alive  # psutil: only paid for by commands that need it

    return alive(status.supervisor_pid, born_by=status.written)


def liveness(status: Status) -> Liveness:
    """The one answer to "is this run live?" (`judge`), asking the process table."""
    return judge(status, supervisor_alive)


def effective_state(status: Status) -> str:
    """The recorded state, or `lost` when it claims to be live but its supervisor is gone."""
    if status.state is None:
        return NA
    return "lost" if liveness(status) == "lost" else status.state


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
